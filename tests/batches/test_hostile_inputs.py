"""Hostile inputs to the Batch API: 4xx or a refused line, never a 500, on SQLite and PostgreSQL (which refuses
NUL in text)."""

from __future__ import annotations

import json

import pytest

from batches.models import StoredFile
from tests.batches.conftest import chat_line, jsonl
from tests.conftest import bearer

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("fields", [
    {"input_file_id": "file-\x00"}, {"input_file_id": "\ud800"}, {"endpoint": "/v1/chat/completions\x00"},
    {"metadata": {"k\x00": "v"}}, {"metadata": {"k": "v\x00"}}, {"metadata": {"\udfff": "v"}},
    {"metadata": {"k": "\ud800"}}, {"input_file_id": ["file-x"]}, {"completion_window": {"24h": True}},
])
def test_batch_create_refuses_hostile_fields(input_file, api_client, api_key, fields):
    body = {"input_file_id": input_file([chat_line("a")]), "endpoint": "/v1/chat/completions",
            "completion_window": "24h", **fields}
    raw = json.dumps(body)  # ASCII, lone surrogates as escapes: what a client can send
    response = api_client.generic("POST", "/v1/batches", raw, content_type="application/json", **bearer(api_key.key))
    assert response.status_code == 400, response.content


def test_deeply_nested_metadata_is_a_400(api_client, api_key):
    body = '{"input_file_id": "file-x", "endpoint": "/v1/completions", "completion_window": "24h", "metadata": ' \
           + "[" * 5000 + "]" * 5000 + "}"
    response = api_client.generic("POST", "/v1/batches", body, content_type="application/json", **bearer(api_key.key))
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_json"


def _raw_upload(api_client, key: str, *, filename: bytes, purpose: bytes = b"batch"):
    """A multipart body written by hand: what a client other than the SDK (which escapes names) may send."""
    boundary = b"hostile-boundary"
    body = (b"--" + boundary + b'\r\nContent-Disposition: form-data; name="purpose"\r\n\r\n' + purpose + b"\r\n--"
            + boundary + b'\r\nContent-Disposition: form-data; name="file"; filename="' + filename
            + b'"\r\nContent-Type: application/octet-stream\r\n\r\n' + jsonl([chat_line("a")]) + b"\r\n--"
            + boundary + b"--\r\n")
    return api_client.generic("POST", "/v1/files", body, content_type=f"multipart/form-data; boundary={boundary.decode()}",
                              **bearer(key))


@pytest.mark.parametrize("filename", [b"a\x00.jsonl", b"\x07.jsonl", b"\xff\xfe.jsonl", b"", b"/", b"../../.jsonl",
                                      b"x" * 300 + b".csv"])
def test_hostile_file_names(api_client, api_key, filename):
    """Refused, or kept as Django's multipart parser cleans it (no folder, no control character)."""
    response = _raw_upload(api_client, api_key.key, filename=filename)
    if response.status_code == 200:
        name = response.json()["filename"]
        assert name.isprintable() and "/" not in name and name.endswith(".jsonl"), name
        assert StoredFile.objects.get().filename == name
    else:
        assert 400 <= response.status_code < 500, response.content
        assert not StoredFile.objects.exists()


def test_a_long_file_name_is_cut_to_the_column(api_client, api_key):
    response = _raw_upload(api_client, api_key.key, filename=b"x" * 300 + b".jsonl")
    assert response.status_code == 200 and response.json()["filename"].endswith(".jsonl")
    assert len(response.json()["filename"]) <= 255


def test_a_non_utf8_purpose_is_a_400(api_client, api_key):
    response = _raw_upload(api_client, api_key.key, filename=b"a.jsonl", purpose=b"\xff\xfebatch")
    assert response.status_code == 400 and response.json()["error"]["param"] == "purpose"


@pytest.mark.parametrize("purpose", ["batch\x00", "b" * 10_000])
def test_hostile_purposes(upload, api_key, purpose):
    response = upload(api_key.key, jsonl([chat_line("a")]), purpose=purpose)
    assert response.status_code == 400 and response.json()["error"]["param"] == "purpose"


def test_hostile_lines_are_refused_lines(input_file, create_batch, api_client, api_key):
    nested = {"custom_id": "deep", "method": "POST", "url": "/v1/chat/completions", "body": {"x": []}}
    deep = json.dumps(nested).replace("[]", "[" * 200 + "]" * 200)
    lines = [b"\xff\xfe not utf-8", deep, json.dumps(chat_line("nul\x00id")), json.dumps(chat_line("NaN")).replace(
        '"max_tokens": 2', '"max_tokens": NaN'), json.dumps(chat_line("a", model="m\x00\ud800")),
        json.dumps(chat_line("\udfff"))]
    created = create_batch(input_file(lines)).json()
    batch = api_client.get(f"/v1/batches/{created['id']}", **bearer(api_key.key)).json()
    assert batch["status"] == "failed"
    codes = [(e["line"], e["code"]) for e in batch["errors"]["data"]]
    assert codes == [(1, "invalid_json_line"), (2, "invalid_json_line"), (3, "invalid_custom_id"),
                     (4, "invalid_json_line"), (5, "invalid_value"), (6, "invalid_custom_id")], codes  # 5: the live parser's


def test_prompts_with_nul_are_stored(input_file, create_batch, api_client, api_key):
    """A live request may carry NUL; so may a batch's line (kept as JSON text, not jsonb)."""
    from batches.models import BatchLine

    lines = [chat_line("nul", content="a\x00b"), chat_line("emoji", content="\U0001f600 é"),
             chat_line("ignored", extra_field="\ud800 \x00")]  # a field the parser ignores: stored as escapes
    created = create_batch(input_file([json.dumps(line) for line in lines])).json()
    batch = api_client.get(f"/v1/batches/{created['id']}", **bearer(api_key.key)).json()
    assert batch["status"] == "in_progress", batch["errors"]
    stored = {line.custom_id: line for line in BatchLine.objects.all()}
    assert [stored[line["custom_id"]].request_body() for line in lines] == [line["body"] for line in lines]
    assert "\U0001f600 é" in stored["emoji"].body  # UTF-8 as it is


def test_error_messages_quote_nul_as_an_escape():
    from batches.services.lines import LineError

    error = LineError(code="x", message="model `m\x00` \ud800", param="body.\x00", line=1).to_dict()
    assert error["message"] == "model `m\\x00` \\ud800" and error["param"] == "body.\\x00"
