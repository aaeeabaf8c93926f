"""A batch's validating phase: each line refusal OpenAI's Batch API reports, with its code, param and line."""

from __future__ import annotations

import pytest

from batches.models import Batch, BatchLine
from tests.batches.conftest import MODEL, chat_line
from tests.conftest import bearer

pytestmark = pytest.mark.django_db


def _validated(create_batch, api_client, api_key, file_id: str, **fields) -> dict:
    created = create_batch(file_id, **fields)
    assert created.status_code == 200, created.content
    return api_client.get(f"/v1/batches/{created.json()['id']}", **bearer(api_key.key)).json()


def test_a_valid_file_becomes_lines_in_progress(input_file, create_batch, api_client, api_key):
    lines = [chat_line(f"req-{n}", content=f"q{n}") for n in range(3)]
    batch = _validated(create_batch, api_client, api_key, input_file(["", *lines, "   "]))
    assert batch["status"] == "in_progress" and batch["errors"] is None and batch["model"] == MODEL
    assert batch["request_counts"] == {"total": 3, "completed": 0, "failed": 0}
    assert batch["in_progress_at"] >= batch["created_at"]
    stored = list(BatchLine.objects.filter(batch__public_id=batch["id"]).order_by("line_no"))
    assert [(line.line_no, line.custom_id, line.status) for line in stored] == [
        (2, "req-0", "pending"), (3, "req-1", "pending"), (4, "req-2", "pending")]
    assert stored[1].request_body() == lines[1]["body"]


def _line(**changes) -> dict:
    line = chat_line("x")
    for key, value in changes.items():
        if value is _DROP:
            line.pop(key)
        else:
            line[key] = value
    return line


_DROP = object()
CASES = {
    "not json": (b"{not json", "invalid_json_line", None),
    "not an object": (b"[1, 2]", "invalid_json_line", None),
    "no custom_id": (_line(custom_id=_DROP), "missing_required_parameter", "custom_id"),
    "no method": (_line(method=_DROP), "missing_required_parameter", "method"),
    "no url": (_line(url=_DROP), "missing_required_parameter", "url"),
    "no body": (_line(body=_DROP), "missing_required_parameter", "body"),
    "custom_id a number": (_line(custom_id=7), "invalid_custom_id", "custom_id"),
    "custom_id empty": (_line(custom_id=""), "invalid_custom_id", "custom_id"),
    "GET": (_line(method="GET"), "invalid_method", "method"),
    "unknown url": (_line(url="/v1/embeddings"), "invalid_url", "url"),
    "other endpoint": (_line(url="/v1/completions", body={"model": MODEL, "prompt": "x"}), "mismatched_endpoint",
                       "url"),
    "body a list": (_line(body=[]), "invalid_value", "body"),
    "no messages": (_line(body={"model": MODEL}), "missing_required_parameter", "body.messages"),
    "temperature": (chat_line("x", temperature=9), "invalid_value", "body.temperature"),
    "stream": (chat_line("x", stream=True), "invalid_value", "body.stream"),
    "unknown model": (chat_line("x", model="no-such-model"), "model_not_found", "body.model"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_each_bad_line_fails_the_batch_with_its_error(name, input_file, create_batch, api_client, api_key):
    bad, code, param = CASES[name]
    batch = _validated(create_batch, api_client, api_key, input_file([chat_line("ok-1"), bad, chat_line("ok-2")]))
    assert batch["status"] == "failed" and batch["failed_at"] is not None and batch["in_progress_at"] is None
    assert batch["errors"]["object"] == "list"
    [error] = batch["errors"]["data"]
    assert (error["code"], error["param"], error["line"]) == (code, param, 2), error
    assert error["message"]
    assert not BatchLine.objects.exists()


def test_live_parser_message_is_reported(input_file, create_batch, api_client, api_key):
    from common.errors import ApiError
    from inference.api.schemas import CHAT, api_request_parse

    body = {"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}
    with pytest.raises(ApiError) as live:
        api_request_parse(endpoint=CHAT, body=body)
    batch = _validated(create_batch, api_client, api_key, input_file([_line(body=body)]))
    [error] = batch["errors"]["data"]
    assert error["message"] == live.value.message and error["param"] == f"body.{live.value.param}"


def test_duplicate_custom_ids_and_mixed_models(input_file, create_batch, api_client, api_key, served_model):
    from inference.models import ServedModel

    ServedModel.objects.create(name="second-model", source=served_model.source, context_length=512)
    lines = [chat_line("a"), chat_line("b"), chat_line("a"), chat_line("c", model="second-model"),
             {**chat_line("b"), "method": "GET"}]
    batch = _validated(create_batch, api_client, api_key, input_file(lines))
    assert [(e["code"], e["line"]) for e in batch["errors"]["data"]] == [
        ("duplicate_custom_id", 3), ("mismatched_model", 4), ("duplicate_custom_id", 5)]


def test_a_model_the_tier_may_not_use_is_not_found(input_file, create_batch, api_client, api_key):
    tier = api_key.api_key.tenant.tier
    tier.allowed_models = ["some-other-model"]
    tier.save()
    batch = _validated(create_batch, api_client, api_key, input_file([chat_line("a")]))
    assert batch["errors"]["data"][0]["code"] == "model_not_found"


def test_a_disabled_model_is_not_found(input_file, create_batch, api_client, api_key, served_model):
    file_id = input_file([chat_line("a")])
    served_model.enabled = False
    served_model.save()
    batch = _validated(create_batch, api_client, api_key, file_id)
    assert batch["errors"]["data"][0]["code"] == "model_not_found"


def test_empty_file_and_too_many_requests(input_file, create_batch, api_client, api_key, settings):
    empty = _validated(create_batch, api_client, api_key, input_file(["", "  "]))
    assert [(e["code"], e["line"]) for e in empty["errors"]["data"]] == [("empty_file", None)]
    settings.BATCH_MAX_LINES = 3
    assert _validated(create_batch, api_client, api_key,
                      input_file([chat_line(str(n)) for n in range(3)]))["status"] == "in_progress"
    many = _validated(create_batch, api_client, api_key, input_file([chat_line(str(n)) for n in range(4)]))
    assert [e["code"] for e in many["errors"]["data"]] == ["too_many_requests"]


def test_errors_reported_are_capped(input_file, create_batch, api_client, api_key):
    from batches.services.validation import MAX_REPORTED_ERRORS

    batch = _validated(create_batch, api_client, api_key, input_file([b"nope"] * (MAX_REPORTED_ERRORS + 5)))
    assert len(batch["errors"]["data"]) == MAX_REPORTED_ERRORS


def test_completions_batches(input_file, create_batch, api_client, api_key):
    line = {"custom_id": "c", "method": "POST", "url": "/v1/completions",
            "body": {"model": MODEL, "prompt": "Once", "max_tokens": 2}}
    batch = _validated(create_batch, api_client, api_key, input_file([line]), endpoint="/v1/completions")
    assert batch["status"] == "in_progress" and batch["endpoint"] == "/v1/completions"


def test_validation_is_idempotent(input_file, create_batch, api_key):
    from batches.services.validation import batch_validate

    created = create_batch(input_file([chat_line("a"), chat_line("b")])).json()
    batch = Batch.objects.get(public_id=created["id"])
    assert batch_validate(batch_id=batch.pk).status == "in_progress"
    assert BatchLine.objects.filter(batch=batch).count() == 2
    assert batch_validate(batch_id=batch.pk).status == "in_progress"  # a redelivered task changes nothing
    assert BatchLine.objects.filter(batch=batch).count() == 2


def test_a_deleted_input_file_fails_its_validation(input_file, api_key):
    from batches.models import StoredFile
    from batches.services.batches import batch_create
    from batches.services.files import files_storage
    from batches.services.validation import batch_validate

    file_id = input_file([chat_line("a")])
    batch = batch_create(tenant=api_key.api_key.tenant, api_key=api_key.api_key, input_file_id=file_id,
                         endpoint="/v1/chat/completions", completion_window="24h")
    files_storage().delete(StoredFile.objects.get(public_id=file_id).storage_name)
    batch = batch_validate(batch_id=batch.pk)
    assert batch.status == "failed" and batch.errors["data"][0]["code"] == "file_unreadable"


def test_stale_validating_batches_are_validated(input_file, api_key):
    from datetime import timedelta

    from batches.services.batches import batch_create
    from batches.services.validation import batches_validate_stale

    batch = batch_create(tenant=api_key.api_key.tenant, api_key=api_key.api_key, input_file_id=input_file(
        [chat_line("a")]), endpoint="/v1/chat/completions", completion_window="24h")  # its task never ran
    assert batches_validate_stale() == 0  # not a minute old
    Batch.objects.filter(pk=batch.pk).update(created_at=batch.created_at - timedelta(minutes=2))
    assert batches_validate_stale() == 1
    batch.refresh_from_db()
    assert batch.status == "in_progress"
