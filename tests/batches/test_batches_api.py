"""/v1/batches: create, retrieve, list with its cursor, cancel; the batch object as OpenAI's."""

from __future__ import annotations

import pytest

from batches.models import Batch, BatchLine
from tests.batches.conftest import chat_line
from tests.conftest import bearer

pytestmark = pytest.mark.django_db

BATCH_FIELDS = {"id", "object", "endpoint", "model", "errors", "input_file_id", "completion_window", "status",
                "output_file_id", "error_file_id", "created_at", "in_progress_at", "expires_at", "finalizing_at",
                "completed_at", "failed_at", "expired_at", "cancelling_at", "cancelled_at", "request_counts",
                "metadata"}


def test_create_answers_the_batch_validating(input_file, create_batch, api_client, api_key):
    file_id = input_file([chat_line("a"), chat_line("b")])
    response = create_batch(file_id, metadata={"job": "nightly"})
    assert response.status_code == 200, response.content
    batch = response.json()
    assert set(batch) == BATCH_FIELDS
    assert batch["id"].startswith("batch_") and batch["object"] == "batch" and batch["status"] == "validating"
    assert batch["input_file_id"] == file_id and batch["endpoint"] == "/v1/chat/completions"
    assert batch["completion_window"] == "24h" and batch["expires_at"] == batch["created_at"] + 24 * 3600
    assert batch["metadata"] == {"job": "nightly"} and batch["output_file_id"] is None
    assert batch["request_counts"] == {"total": 0, "completed": 0, "failed": 0}
    again = api_client.get(f"/v1/batches/{batch['id']}", **bearer(api_key.key)).json()
    assert again["status"] == "in_progress" and again["request_counts"]["total"] == 2


@pytest.mark.parametrize("fields, param", [
    ({"endpoint": "/v1/embeddings"}, "endpoint"),
    ({"completion_window": "48h"}, "completion_window"),
    ({"metadata": {f"k{n}": "v" for n in range(17)}}, "metadata"),
    ({"metadata": {"k" * 65: "v"}}, "metadata"),
    ({"metadata": {"k": "v" * 513}}, "metadata"),
    ({"metadata": {"k": 1}}, "metadata"),
    ({"metadata": ["k"]}, "metadata"),
    ({"input_file_id": None}, "input_file_id"),
    ({"endpoint": None}, "endpoint"),
])
def test_create_refuses_bad_fields(input_file, create_batch, fields, param):
    response = create_batch(input_file([chat_line("a")]), **fields)
    assert response.status_code == 400, response.content
    assert response.json()["error"]["param"] == param
    assert not Batch.objects.exists()


def test_metadata_at_its_limits_is_kept(input_file, create_batch):
    metadata = {f"{n:02d}" + "k" * 62: "v" * 512 for n in range(16)}
    response = create_batch(input_file([chat_line("a")]), metadata=metadata)
    assert response.status_code == 200 and response.json()["metadata"] == metadata


def test_create_needs_a_batch_file_of_ones_own(input_file, create_batch, api_key_factory, api_client, api_key):
    file_id = input_file([chat_line("a")])
    other = api_key_factory()
    foreign = create_batch(file_id, key=other.key)
    assert foreign.status_code == 404 and foreign.json()["error"]["code"] == "file_not_found"
    assert create_batch("file-unknown").status_code == 404
    from batches.models import StoredFile

    StoredFile.objects.filter(public_id=file_id).update(purpose=StoredFile.Purpose.BATCH_OUTPUT)
    assert create_batch(file_id).json()["error"]["param"] == "input_file_id"
    api_client.delete(f"/v1/files/{file_id}", **bearer(api_key.key))
    assert create_batch(file_id).status_code == 404
    assert not Batch.objects.exists()


def test_list_pages_newest_first(input_file, create_batch, api_client, api_key):
    file_id = input_file([chat_line("a")])
    ids = [create_batch(file_id).json()["id"] for _ in range(5)]
    first = api_client.get("/v1/batches", {"limit": 2}, **bearer(api_key.key)).json()
    assert [b["id"] for b in first["data"]] == [ids[4], ids[3]]
    assert (first["first_id"], first["last_id"], first["has_more"]) == (ids[4], ids[3], True)
    second = api_client.get("/v1/batches", {"limit": 2, "after": ids[3]}, **bearer(api_key.key)).json()
    assert [b["id"] for b in second["data"]] == [ids[2], ids[1]] and second["has_more"] is True
    last = api_client.get("/v1/batches", {"limit": 2, "after": ids[1]}, **bearer(api_key.key)).json()
    assert [b["id"] for b in last["data"]] == [ids[0]] and last["has_more"] is False
    default = api_client.get("/v1/batches", **bearer(api_key.key)).json()
    assert len(default["data"]) == 5 and default["has_more"] is False
    for params in ({"limit": 0}, {"limit": 101}, {"after": "batch_nope"}):
        assert api_client.get("/v1/batches", params, **bearer(api_key.key)).status_code == 400


def test_cancel_a_validating_batch(input_file, api_client, api_key):
    response = api_client.post("/v1/batches", {"input_file_id": input_file([chat_line("a")]),
                                               "endpoint": "/v1/chat/completions", "completion_window": "24h"},
                               format="json", **bearer(api_key.key))  # its validation never runs (not committed)
    batch_id = response.json()["id"]
    cancelled = api_client.post(f"/v1/batches/{batch_id}/cancel", **bearer(api_key.key)).json()
    assert cancelled["status"] == "cancelled" and cancelled["cancelling_at"] and cancelled["cancelled_at"]
    from batches.services.validation import batch_validate

    assert batch_validate(batch_id=Batch.objects.get(public_id=batch_id).pk).status == "cancelled"
    assert not BatchLine.objects.exists()


def test_cancel_an_in_progress_batch_cancels_its_pending_lines(input_file, create_batch, api_client, api_key):
    batch_id = create_batch(input_file([chat_line("a"), chat_line("b"), chat_line("c")])).json()["id"]
    BatchLine.objects.filter(custom_id="b").update(status=BatchLine.Status.RUNNING)  # a runner holds it
    cancelling = api_client.post(f"/v1/batches/{batch_id}/cancel", **bearer(api_key.key)).json()
    assert cancelling["status"] == "cancelling" and cancelling["cancelled_at"] is None
    assert dict(BatchLine.objects.values_list("custom_id", "status")) == {
        "a": "cancelled", "b": "running", "c": "cancelled"}
    again = api_client.post(f"/v1/batches/{batch_id}/cancel", **bearer(api_key.key))
    assert again.status_code == 200 and again.json()["cancelling_at"] == cancelling["cancelling_at"]


@pytest.mark.parametrize("status", ["completed", "failed", "expired"])
def test_a_finished_batch_cannot_be_cancelled(input_file, create_batch, api_client, api_key, status):
    batch_id = create_batch(input_file([chat_line("a")])).json()["id"]
    Batch.objects.filter(public_id=batch_id).update(status=status)
    response = api_client.post(f"/v1/batches/{batch_id}/cancel", **bearer(api_key.key))
    assert response.status_code == 409 and response.json()["error"]["code"] == "batch_not_cancellable"
    assert Batch.objects.get(public_id=batch_id).status == status


def test_another_tenants_batch_is_a_404(input_file, create_batch, api_client, api_key, api_key_factory):
    batch_id = create_batch(input_file([chat_line("a")])).json()["id"]
    other = api_key_factory().key
    for method, path in (("get", f"/v1/batches/{batch_id}"), ("post", f"/v1/batches/{batch_id}/cancel")):
        response = getattr(api_client, method)(path, **bearer(other))
        assert response.status_code == 404 and response.json()["error"]["code"] == "batch_not_found"
    assert api_client.get("/v1/batches", **bearer(other)).json()["data"] == []
    assert api_client.get("/v1/batches", {"after": batch_id}, **bearer(other)).status_code == 400
    assert Batch.objects.get(public_id=batch_id).status == "in_progress"


def test_batches_need_the_inference_scope(api_key_factory, tenant, api_client):
    usage_only = api_key_factory(tenant=tenant, scopes=["usage:read"]).key
    assert api_client.get("/v1/batches", **bearer(usage_only)).status_code == 403
    assert api_client.post("/v1/batches", {}, format="json", **bearer(usage_only)).status_code == 403
