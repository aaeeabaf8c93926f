"""A batch past its completion window: its pending lines expire at once (never run, never billed), and the batch
becomes `expired` together with its output and error files, at once when no line runs, else when the last
running line ends; a client never sees an expired batch without its files (as a cancelled one: cb761ec)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from batches.models import Batch, BatchLine, StoredFile
from batches.services.runs import (
    batch_expire_settle, batch_line_finish, batch_lines_claim, batch_settle, batches_expire,
)
from batches.services.transitions import S
from tests.batches.conftest import postgres_only, race
from tests.conftest import bearer

pytestmark = pytest.mark.django_db
L = BatchLine.Status


def _window_ends(batch: Batch) -> None:
    Batch.objects.filter(pk=batch.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    batch.refresh_from_db()


def _view(api_client, api_key, batch: Batch) -> dict:
    return api_client.get(f"/v1/batches/{batch.public_id}", **bearer(api_key.key)).json()


def _file(file: StoredFile) -> list[dict]:
    from batches.services.files import file_open

    with file_open(file=file) as handle:
        return [json.loads(line) for line in handle.read().splitlines()]


def _outputs() -> int:
    """Batch output and error files not deleted (a call beaten to the move deletes the ones it wrote)."""
    return StoredFile.objects.filter(purpose=StoredFile.Purpose.BATCH_OUTPUT, deleted_at__isnull=True).count()


def _read(api_client, api_key, file_id: str | None) -> list[dict]:
    from tests.batches.test_files_api import streamed

    if file_id is None:
        return []
    response = api_client.get(f"/v1/files/{file_id}/content", **bearer(api_key.key))
    assert response.status_code == 200
    return [json.loads(line) for line in streamed(response).splitlines()]


def test_with_nothing_running_it_expires_at_once_with_its_files(batch, api_client, api_key):
    [done] = batch_lines_claim(batch=batch, runner="r", limit=1)
    assert batch_line_finish(line=done, runner="r", status_code=200, body={"ok": True})
    _window_ends(batch)
    assert batches_expire() == 1
    view = _view(api_client, api_key, batch)
    assert view["status"] == "expired" and view["expired_at"] is not None
    assert view["output_file_id"] is not None and view["error_file_id"] is not None
    assert [line["custom_id"] for line in _read(api_client, api_key, view["output_file_id"])] == ["c0"]
    errors = _read(api_client, api_key, view["error_file_id"])
    assert [(e["custom_id"], e["response"], e["error"]["code"]) for e in errors] == [
        (f"c{n}", None, "batch_expired") for n in range(1, 5)]
    assert not BatchLine.objects.filter(status=L.EXPIRED).exclude(request_id="").exists()  # never ran


def test_with_a_line_running_it_expires_when_that_line_ends(batch, api_client, api_key):
    first, second = batch_lines_claim(batch=batch, runner="r", limit=2)
    assert batch_line_finish(line=first, runner="r", status_code=200, body={"n": 1})
    _window_ends(batch)
    assert batches_expire() == 0  # `second` still runs: the batch is not expired without its files
    view = _view(api_client, api_key, batch)
    assert view["status"] == "in_progress" and view["output_file_id"] is None and view["error_file_id"] is None
    assert view["expired_at"] is None and _outputs() == 0
    assert BatchLine.objects.filter(batch=batch, status=L.EXPIRED).count() == 3  # at once, never run
    assert batch_lines_claim(batch=batch, runner="r2", limit=10) == []
    assert batches_expire() == 0  # again, while it runs: nothing moves
    assert batch_line_finish(line=second, runner="r", status_code=400, body={"error": {"message": "no"}})
    assert batch_settle(batch=batch) == S.EXPIRED  # as the runner's line ending calls it
    view = _view(api_client, api_key, batch)
    assert view["status"] == "expired" and view["request_counts"] == {"total": 5, "completed": 1, "failed": 1}
    assert [line["custom_id"] for line in _read(api_client, api_key, view["output_file_id"])] == ["c0"]
    errors = _read(api_client, api_key, view["error_file_id"])
    assert [(e["custom_id"], (e["error"] or {}).get("code")) for e in errors] == [
        ("c1", None), ("c2", "batch_expired"), ("c3", "batch_expired"), ("c4", "batch_expired")]
    assert errors[0]["response"]["status_code"] == 400
    assert batches_expire() == 0 and batch_settle(batch=batch) == S.EXPIRED and _outputs() == 2


def test_the_runners_settle_expires_it_without_the_task(batch):
    """The window over and no task run yet (the embedded mode has no beat): the runner's settle ends it."""
    [running] = batch_lines_claim(batch=batch, runner="r", limit=1)
    _window_ends(batch)
    assert batch_settle(batch=batch) == S.IN_PROGRESS
    assert BatchLine.objects.filter(batch=batch, status=L.EXPIRED).count() == 4
    batch_line_finish(line=running, runner="r", status_code=200, body={})
    assert batch_settle(batch=batch) == S.EXPIRED
    assert batch.output_file_id is not None and batch.error_file_id is not None


def test_a_line_put_back_after_the_window_expires_instead_of_running(batch):
    from batches.services.runs import batch_lines_release

    [line] = batch_lines_claim(batch=batch, runner="r", limit=1)
    _window_ends(batch)
    assert batches_expire() == 0
    assert batch_lines_release(runner="r") == 1  # refused for now (a rate limit): back to pending
    assert batch_lines_claim(batch=batch, runner="r", limit=10) == []
    assert batches_expire() == 1
    assert BatchLine.objects.get(pk=line.pk).status == L.EXPIRED


def test_expire_is_idempotent_and_a_beaten_call_leaves_no_files(batch, tmp_path,
                                                                django_capture_on_commit_callbacks):
    stale = Batch.objects.get(pk=batch.pk)
    _window_ends(batch)
    assert batches_expire() == 1
    assert batches_expire() == 0
    batch.refresh_from_db()
    expired_at, error_file = batch.expired_at, batch.error_file_id
    with django_capture_on_commit_callbacks(execute=True):
        assert not batch_expire_settle(batch=stale)  # read in_progress, moved meanwhile: its files deleted
    batch.refresh_from_db()
    assert batch.status == S.EXPIRED and (batch.expired_at, batch.error_file_id) == (expired_at, error_file)
    assert _outputs() == 1 and batch.output_file_id is None  # the error file alone: nothing ran
    on_disk = {p.name for p in (tmp_path / "files").rglob("*.jsonl")}
    kept = {f.storage_name.rsplit("/", 1)[-1] for f in StoredFile.objects.filter(deleted_at__isnull=True)}
    assert on_disk == kept  # no bytes left by the beaten call


def test_a_cancel_after_the_window_keeps_the_expired_lines(batch):
    from batches.services.batches import batch_cancel

    [running] = batch_lines_claim(batch=batch, runner="r", limit=1)
    _window_ends(batch)
    batches_expire()
    assert batch_cancel(batch=batch).status == S.CANCELLING
    batch_line_finish(line=running, runner="r", status_code=200, body={})
    assert batch_settle(batch=batch) == S.CANCELLED and batch.error_file_id is not None
    codes = {e["error"]["code"] for e in _file(batch.error_file)}
    assert codes == {"batch_expired"}


def test_the_runner_claims_nothing_of_a_batch_past_its_window(batch):
    from asgiref.sync import async_to_sync

    from batches.runner import BatchRunner

    [running] = batch_lines_claim(batch=batch, runner="other", limit=1)
    _window_ends(batch)
    runner = BatchRunner(name="r", max_in_flight=4, poll_s=0.01, lease_s=60)
    assert async_to_sync(runner.run_once)()
    assert not runner.tasks and BatchLine.objects.filter(batch=batch, status=L.RUNNING).count() == 1
    assert BatchLine.objects.filter(batch=batch, status=L.EXPIRED).count() == 4
    batch.refresh_from_db()
    assert batch.status == S.IN_PROGRESS and batch.output_file_id is None
    batch_line_finish(line=running, runner="other", status_code=200, body={})
    async_to_sync(runner.run_once)()
    batch.refresh_from_db()
    assert batch.status == S.EXPIRED and batch.output_file_id is not None and batch.error_file_id is not None


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_expire_calls_at_once_move_the_batch_once(batch):
    _window_ends(batch)
    moved = race(6, lambda _: batches_expire())
    assert sorted(moved) == [0] * 5 + [1], moved
    batch.refresh_from_db()
    assert batch.status == S.EXPIRED and batch.error_file_id is not None and _outputs() == 1


@postgres_only
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("attempt", range(3))
def test_the_last_line_ending_races_the_expire_task(batch, attempt):
    """Whichever commits first, the batch ends `expired` once, with the finished line in its output file."""
    [running] = batch_lines_claim(batch=batch, runner="r", limit=1)
    _window_ends(batch)

    def work(index: int):
        if index == 0:
            batch_line_finish(line=running, runner="r", status_code=200, body={"n": 0})
            return batch_settle(batch=Batch.objects.get(pk=batch.pk))
        return batches_expire()

    results = race(4, work)
    assert not [r for r in results if isinstance(r, Exception)], results
    batch.refresh_from_db()
    assert batch.status == S.EXPIRED and _outputs() == 2
    assert [line["custom_id"] for line in _file(batch.output_file)] == ["c0"]
    assert len(_file(batch.error_file)) == 4
