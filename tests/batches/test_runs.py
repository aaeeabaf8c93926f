"""The runner's calls: claim, finish once, release, leases renewed and reaped, settle, end, expire."""

from __future__ import annotations

from datetime import timedelta

import pytest

from batches.models import BatchLine
from batches.services.outputs import batch_files_attach
from batches.services.runs import (
    batch_end_check, batch_line_finish, batch_lines_claim, batch_lines_reap, batch_lines_release, batch_lines_renew,
    batch_settle, batches_expire,
)

pytestmark = pytest.mark.django_db
L = BatchLine.Status


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
    [running] = batch_lines_claim(batch=batch, runner="r", limit=1)
    assert batches_expire() == 0
    assert batches_expire(now=batch.expires_at + timedelta(seconds=1)) == 0  # one runs: not expired yet
    batch.refresh_from_db()
    assert batch.status == "in_progress" and batch.expired_at is None
    assert BatchLine.objects.filter(status=L.EXPIRED).count() == 4
    assert BatchLine.objects.filter(status=L.EXPIRED).first().error["code"] == "batch_expired"
    assert batch_lines_claim(batch=batch, runner="r", limit=10) == []
    batch_line_finish(line=running, runner="r", status_code=200, body={})
    assert batches_expire(now=batch.expires_at + timedelta(seconds=1)) == 1
    batch.refresh_from_db()
    assert batch.status == "expired" and batch.expired_at is not None


def test_lines_refused_for_now_go_back_alone(batch):
    first, second = batch_lines_claim(batch=batch, runner="r", limit=2)
    assert batch_lines_release(runner="r", pks=[first.pk]) == 1
    assert BatchLine.objects.get(pk=first.pk).status == L.PENDING
    assert BatchLine.objects.get(pk=second.pk).status == L.RUNNING


def test_a_lapsed_lease_is_reaped_and_a_renewed_one_kept(batch):
    from django.utils import timezone

    [kept] = batch_lines_claim(batch=batch, runner="alive", limit=1)
    [lapsed] = batch_lines_claim(batch=batch, runner="killed", limit=1)
    later = timezone.now() + timedelta(seconds=200)
    BatchLine.objects.filter(pk=kept.pk).update(claimed_at=later)  # as batch_lines_renew does, 200 s on
    assert batch_lines_renew(runner="alive") == 1 and batch_lines_renew(runner="nobody") == 0
    BatchLine.objects.filter(pk=kept.pk).update(claimed_at=later)
    assert batch_lines_reap(lease_s=120, now=later) == 1
    assert BatchLine.objects.get(pk=lapsed.pk).status == L.PENDING
    assert BatchLine.objects.get(pk=kept.pk).status == L.RUNNING
    assert not batch_line_finish(line=lapsed, runner="killed", status_code=200, body={})  # too late


def test_settle_writes_the_files_once_the_last_line_ends(batch):
    lines = batch_lines_claim(batch=batch, runner="r", limit=10)
    for line in lines[:-1]:
        batch_line_finish(line=line, runner="r", status_code=200, body={"n": line.line_no})
    assert batch_settle(batch=batch) == "in_progress"
    batch_line_finish(line=lines[-1], runner="r", status_code=400, body={"error": {"message": "no"}})
    assert batch_settle(batch=batch) == "completed"
    assert batch.output_file_id is not None and batch.error_file_id is not None


def test_settle_expires_a_batch_with_the_files_of_the_lines_that_ran(batch):
    [line] = batch_lines_claim(batch=batch, runner="r", limit=1)
    batches_expire(now=batch.expires_at + timedelta(seconds=1))
    batch.refresh_from_db()
    assert batch_settle(batch=batch) == "in_progress" and batch.output_file_id is None  # one still runs
    batch_line_finish(line=line, runner="r", status_code=200, body={})
    assert batch_settle(batch=batch) == "expired"
    assert batch.output_file_id is not None and batch.error_file_id is not None  # 1 answer, 4 expired


def test_settle_attaches_the_files_of_a_batch_expired_before_them(batch):
    """A batch an earlier release moved to `expired` while a line ran gets its files when that line ends."""
    from batches.services.transitions import batch_transition

    [line] = batch_lines_claim(batch=batch, runner="r", limit=1)
    assert batch_transition(batch=batch, to="expired")
    batch_line_finish(line=line, runner="r", status_code=200, body={})
    assert batch_settle(batch=batch) == "expired" and batch.output_file_id is not None


def test_an_expired_batch_with_nothing_running_gets_its_files_at_once(batch):
    assert batches_expire(now=batch.expires_at + timedelta(seconds=1)) == 1
    batch.refresh_from_db()
    assert batch.status == "expired" and batch.output_file_id is None and batch.error_file_id is not None
    assert batches_expire(now=batch.expires_at + timedelta(seconds=1)) == 0  # once
