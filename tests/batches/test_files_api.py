"""/v1/files through the Django test client, with the multipart body the openai SDK sends."""

from __future__ import annotations

import pytest

from batches.models import StoredFile
from tests.batches.conftest import chat_line, jsonl
from tests.conftest import bearer

pytestmark = pytest.mark.django_db


def test_upload_retrieve_content_and_delete(upload, api_client, api_key):
    content = jsonl([chat_line("a"), chat_line("b")])
    response = upload(api_key.key, content, filename="my input.jsonl")
    assert response.status_code == 200, response.content
    file = response.json()
    assert file["id"].startswith("file-") and file["object"] == "file"
    assert file["bytes"] == len(content) and file["filename"] == "my input.jsonl"
    assert file["purpose"] == "batch" and file["status"] == "processed" and file["expires_at"] is None
    assert isinstance(file["created_at"], int)

    assert api_client.get(f"/v1/files/{file['id']}", **bearer(api_key.key)).json() == file
    body = api_client.get(f"/v1/files/{file['id']}/content", **bearer(api_key.key))
    assert body.status_code == 200 and streamed(body) == content
    assert body["Content-Type"] == "application/octet-stream" and body["Content-Length"] == str(len(content))
    assert body["Content-Disposition"] == 'attachment; filename="my input.jsonl"'

    stored = StoredFile.objects.get(public_id=file["id"])
    from django.core.files.storage import storages

    assert storages["files"].exists(stored.storage_name)
    assert stored.storage_name.startswith(f"tenant-{api_key.api_key.tenant_id}/")
    deleted = api_client.delete(f"/v1/files/{file['id']}", **bearer(api_key.key))
    assert deleted.json() == {"id": file["id"], "object": "file", "deleted": True}
    for path in (f"/v1/files/{file['id']}", f"/v1/files/{file['id']}/content"):
        gone = api_client.get(path, **bearer(api_key.key))
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "file_not_found"
    assert api_client.delete(f"/v1/files/{file['id']}", **bearer(api_key.key)).status_code == 404


def streamed(response) -> bytes:
    """A streamed response's bytes (an async iterator: the ASGI handler's way), read as that handler does."""
    from asgiref.sync import async_to_sync

    async def read():
        return b"".join([chunk async for chunk in response.streaming_content])

    return async_to_sync(read)()


def test_a_large_file_streams_in_chunks(upload, api_client, api_key):
    from batches.downloads import CHUNK_BYTES

    content = jsonl([chat_line(str(n), content="z" * 1000) for n in range(600)])
    assert len(content) > 2 * CHUNK_BYTES
    file_id = upload(api_key.key, content).json()["id"]
    response = api_client.get(f"/v1/files/{file_id}/content", **bearer(api_key.key))
    assert streamed(response) == content


def test_deleted_files_bytes_go_once_committed(upload, api_key, django_capture_on_commit_callbacks, api_client):
    from django.core.files.storage import storages

    file_id = upload(api_key.key, jsonl([chat_line("a")])).json()["id"]
    name = StoredFile.objects.get(public_id=file_id).storage_name
    with django_capture_on_commit_callbacks(execute=True):
        api_client.delete(f"/v1/files/{file_id}", **bearer(api_key.key))
    assert not storages["files"].exists(name)
    assert StoredFile.objects.get(public_id=file_id).deleted_at is not None  # the row stays: batches name it


def _ids(response) -> list[str]:
    return [item["id"] for item in response.json()["data"]]


def test_list_newest_first_with_cursor_order_and_purpose(upload, api_client, api_key):
    ids = [upload(api_key.key, jsonl([chat_line(str(n))]), filename=f"f{n}.jsonl").json()["id"] for n in range(5)]
    StoredFile.objects.filter(public_id=ids[0]).update(purpose=StoredFile.Purpose.BATCH_OUTPUT)
    everything = api_client.get("/v1/files", **bearer(api_key.key)).json()
    assert everything["object"] == "list" and [f["id"] for f in everything["data"]] == ids[::-1]
    assert everything["has_more"] is False and everything["first_id"] == ids[4] and everything["last_id"] == ids[0]

    first = api_client.get("/v1/files", {"limit": 2}, **bearer(api_key.key)).json()
    assert [f["id"] for f in first["data"]] == [ids[4], ids[3]] and first["has_more"] is True
    second = api_client.get("/v1/files", {"limit": 2, "after": first["last_id"]}, **bearer(api_key.key))
    assert _ids(second) == [ids[2], ids[1]] and second.json()["has_more"] is True
    oldest = api_client.get("/v1/files", {"order": "asc", "limit": 2}, **bearer(api_key.key))
    assert _ids(oldest) == [ids[0], ids[1]]
    batch_only = api_client.get("/v1/files", {"purpose": "batch"}, **bearer(api_key.key))
    assert _ids(batch_only) == ids[:0:-1]
    outputs = api_client.get("/v1/files", {"purpose": "batch_output"}, **bearer(api_key.key))
    assert _ids(outputs) == [ids[0]]


@pytest.mark.parametrize("params, param", [({"limit": 0}, "limit"), ({"limit": "x"}, "limit"),
                                           ({"order": "sideways"}, "order"), ({"purpose": "fine-tune"}, "purpose"),
                                           ({"after": "file-unknown"}, "after")])
def test_list_refuses_bad_parameters(api_client, api_key, params, param):
    response = api_client.get("/v1/files", params, **bearer(api_key.key))
    assert response.status_code == 400 and response.json()["error"]["param"] == param


@pytest.mark.parametrize("fields, code, param", [
    ({"purpose": "fine-tune"}, "invalid_value", "purpose"),
    ({"purpose": ""}, "invalid_value", "purpose"),
    ({"filename": "input.csv"}, "invalid_file_format", "file"),
    ({"filename": "dir/../x.txt"}, "invalid_file_format", "file"),
])
def test_upload_refuses_bad_purpose_and_format(upload, api_key, fields, code, param):
    response = upload(api_key.key, jsonl([chat_line("a")]), **fields)
    assert response.status_code == 400, response.content
    assert response.json()["error"]["code"] == code and response.json()["error"]["param"] == param
    assert not StoredFile.objects.exists()


def test_upload_without_a_file_or_as_json(api_client, api_key):
    body = api_client.post("/v1/files", {"purpose": "batch"}, **bearer(api_key.key))  # multipart, no file
    assert body.status_code == 400 and body.json()["error"]["code"] == "missing_required_parameter"
    as_json = api_client.post("/v1/files", {"purpose": "batch"}, format="json", **bearer(api_key.key))
    assert as_json.status_code == 415 and as_json.json()["error"]["code"] == "unsupported_media_type"


def test_upload_over_the_size_limit(upload, api_key, settings):
    settings.FILES_MAX_BYTES = 100
    response = upload(api_key.key, jsonl([chat_line("a"), chat_line("b")]))
    assert response.status_code == 413 and response.json()["error"]["code"] == "file_too_large"
    assert not StoredFile.objects.exists()


def test_files_need_the_inference_scope(api_key_factory, tenant, upload, api_client):
    usage_only = api_key_factory(tenant=tenant, scopes=["usage:read"]).key
    response = upload(usage_only, jsonl([chat_line("a")]))
    assert response.status_code == 403 and response.json()["error"]["code"] == "insufficient_scope"
    assert api_client.get("/v1/files", **bearer(usage_only)).status_code == 403
    assert api_client.get("/v1/files").status_code == 401


def test_another_tenants_file_is_a_404(upload, api_client, api_key, api_key_factory):
    file_id = upload(api_key.key, jsonl([chat_line("a")])).json()["id"]
    other = api_key_factory().key
    for method, path in (("get", f"/v1/files/{file_id}"), ("get", f"/v1/files/{file_id}/content"),
                         ("delete", f"/v1/files/{file_id}")):
        response = getattr(api_client, method)(path, **bearer(other))
        assert response.status_code == 404 and response.json()["error"]["code"] == "file_not_found"
    assert api_client.get("/v1/files", **bearer(other)).json()["data"] == []
    refused = api_client.get("/v1/files", {"after": file_id}, **bearer(other))  # not a cursor of theirs
    assert refused.status_code == 400
    assert StoredFile.objects.get(public_id=file_id).deleted_at is None
