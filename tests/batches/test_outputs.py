"""A batch's output and error files, in OpenAI's line format, read back through /v1/files."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from batches.models import Batch
from batches.services.batches import batch_cancel
from batches.services.outputs import batch_files_attach
from batches.services.runs import batch_end_check, batch_line_finish, batch_lines_claim, batches_expire
from tests.batches.conftest import chat_line
from tests.batches.test_files_api import streamed
from tests.conftest import bearer

pytestmark = pytest.mark.django_db


@pytest.fixture
def batch(input_file, create_batch):
    created = create_batch(input_file([chat_line(f"c{n}") for n in range(4)])).json()
    return Batch.objects.get(public_id=created["id"])


def _lines(api_client, key: str, file_id: str) -> list[dict]:
    response = api_client.get(f"/v1/files/{file_id}/content", **bearer(key))
    assert response.status_code == 200
    return [json.loads(line) for line in streamed(response).splitlines()]


def test_a_completed_batch_has_its_output_and_error_files(batch, api_client, api_key):
    lines = batch_lines_claim(batch=batch, runner="r", limit=10)
    for line in lines[:3]:
        batch_line_finish(line=line, runner="r", status_code=200, body={"object": "chat.completion", "n": line.line_no,
                                                                       "text": "a\x00b"})
    refusal = {"error": {"message": "context", "type": "invalid_request_error", "param": "messages", "code": None}}
    batch_line_finish(line=lines[3], runner="r", status_code=400, body=refusal)
    assert batch_end_check(batch=batch) == "finalizing"
    assert batch_files_attach(batch=batch)
    assert not batch_files_attach(batch=batch)  # once
    view = api_client.get(f"/v1/batches/{batch.public_id}", **bearer(api_key.key)).json()
    assert view["status"] == "completed" and view["request_counts"] == {"total": 4, "completed": 3, "failed": 1}
    output = _lines(api_client, api_key.key, view["output_file_id"])
    assert [line["custom_id"] for line in output] == ["c0", "c1", "c2"]
    first = output[0]
    assert first["id"].startswith("batch_req_") and first["error"] is None
    assert first["response"] == {"status_code": 200, "request_id": lines[0].request_id,
                                 "body": {"object": "chat.completion", "n": 1, "text": "a\x00b"}}
    [failed] = _lines(api_client, api_key.key, view["error_file_id"])
    assert failed["custom_id"] == "c3" and failed["response"]["status_code"] == 400
    assert failed["response"]["body"] == refusal and failed["error"] is None
    files = api_client.get("/v1/files", {"purpose": "batch_output"}, **bearer(api_key.key)).json()["data"]
    assert {f["filename"] for f in files} == {f"{batch.public_id}_output.jsonl", f"{batch.public_id}_errors.jsonl"}


def test_an_expired_batch_lists_its_unrun_lines_as_errors(batch, api_client, api_key):
    [line] = batch_lines_claim(batch=batch, runner="r", limit=1)
    batch_line_finish(line=line, runner="r", status_code=200, body={"ok": True})
    batches_expire(now=batch.expires_at + timedelta(seconds=1))  # none running: its files are written now
    batch.refresh_from_db()
    assert not batch_files_attach(batch=batch)  # and only once
    view = api_client.get(f"/v1/batches/{batch.public_id}", **bearer(api_key.key)).json()
    assert view["status"] == "expired"
    assert [line["custom_id"] for line in _lines(api_client, api_key.key, view["output_file_id"])] == ["c0"]
    errors = _lines(api_client, api_key.key, view["error_file_id"])
    assert [(e["custom_id"], e["response"], e["error"]["code"]) for e in errors] == [
        ("c1", None, "batch_expired"), ("c2", None, "batch_expired"), ("c3", None, "batch_expired")]


def test_a_cancelled_batch_without_results_has_an_error_file_only(batch, api_client, api_key):
    assert batch_cancel(batch=batch).status == "cancelled"  # none was running: its files are written at once
    assert not batch_files_attach(batch=batch)  # and only once
    view = api_client.get(f"/v1/batches/{batch.public_id}", **bearer(api_key.key)).json()
    assert view["output_file_id"] is None
    assert {e["error"]["code"] for e in _lines(api_client, api_key.key, view["error_file_id"])} == {"batch_cancelled"}
