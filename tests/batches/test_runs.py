"""The runner's calls (part 2 builds on them): claim, finish once, release, end, expire."""

from __future__ import annotations

from datetime import timedelta

import pytest

from batches.models import Batch, BatchLine
from batches.services.outputs import batch_files_attach
from batches.services.runs import (
    batch_end_check, batch_line_finish, batch_lines_claim, batch_lines_release, batches_expire,
)
from tests.batches.conftest import chat_line

pytestmark = pytest.mark.django_db
L = BatchLine.Status


@pytest.fixture
def batch(input_file, create_batch):
    created = create_batch(input_file([chat_line(f"c{n}") for n in range(5)])).json()
    return Batch.objects.get(public_id=created["id"])


def test_claim_in_file_order_and_never_twice(batch):
    first = batch_lines_claim(batch=batch, runner="r1", limit=2)
    assert [line.custom_id for line in first] == ["c0", "c1"]
    assert all(line.status == L.RUNNING and line.attempts == 1 for line in first)
    assert first[0].request_id == f"{batch.public_id}-{first[0].line_no}"
    second = batch_lines_claim(batch=batch, runner="r2", limit=10)
    assert [line.custom_id for line in second] == ["c2", "c3", "c4"]
    assert batch_lines_claim(batch=batch, runner="r3", limit=10) == []


def test_finish_counts_once(batch):
    ok, bad = batch_lines_claim(batch=batch, runner="r1", limit=2)
    assert batch_line_finish(line=ok, runner="r1", status_code=200, body={"id": "x"})
    assert not batch_line_finish(line=ok, runner="r1", status_code=200, body={"id": "x"})  # a retry
    assert not batch_line_finish(line=bad, runner="r2", status_code=200, body={})  # not r2's
    assert batch_line_finish(line=bad, runner="r1", status_code=400, body={"error": {"message": "no"}})
    batch.refresh_from_db()
    assert (batch.completed, batch.failed) == (1, 1)
    assert BatchLine.objects.get(pk=bad.pk).status == L.FAILED


def test_a_dead_runners_lines_are_claimed_again_with_their_request_ids(batch):
    [line] = batch_lines_claim(batch=batch, runner="dead", limit=1)
    assert batch_lines_release(runner="dead") == 1
    [again] = batch_lines_claim(batch=batch, runner="alive", limit=1)
    assert again.pk == line.pk and again.request_id == line.request_id and again.attempts == 2
    assert not batch_line_finish(line=line, runner="dead", status_code=200, body={})


def test_end_check_finalizes_then_complete(batch):
    lines = batch_lines_claim(batch=batch, runner="r", limit=10)
    for line in lines[:-1]:
        batch_line_finish(line=line, runner="r", status_code=200, body={})
    assert batch_end_check(batch=batch) == "in_progress"
    batch_line_finish(line=lines[-1], runner="r", status_code=200, body={})
    assert batch_end_check(batch=batch) == "finalizing"
    assert batch_files_attach(batch=batch)
    batch.refresh_from_db()
    assert batch.status == "completed" and batch.completed == 5 and batch.completed_at >= batch.finalizing_at


def test_a_cancelled_batch_ends_when_its_running_lines_do(batch):
    from batches.services.batches import batch_cancel

    [running] = batch_lines_claim(batch=batch, runner="r", limit=1)
    assert batch_cancel(batch=batch).status == "cancelling"
    assert batch_lines_claim(batch=batch, runner="r", limit=10) == []
    batch_line_finish(line=running, runner="r", status_code=200, body={})
    assert batch_end_check(batch=batch) == "cancelled"
    assert BatchLine.objects.filter(status=L.CANCELLED).count() == 4


def test_expired_batches_leave_their_pending_lines_unrun(batch):
    batch_lines_claim(batch=batch, runner="r", limit=1)
    assert batches_expire() == 0
    assert batches_expire(now=batch.expires_at + timedelta(seconds=1)) == 1
    batch.refresh_from_db()
    assert batch.status == "expired" and batch.expired_at is not None
    assert BatchLine.objects.filter(status=L.EXPIRED).count() == 4
    assert BatchLine.objects.filter(status=L.EXPIRED).first().error["code"] == "batch_expired"
    assert batch_lines_claim(batch=batch, runner="r", limit=10) == []
