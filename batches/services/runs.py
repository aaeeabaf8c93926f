"""What the batch runner (issue 39, part 2) calls: claim a batch's pending lines, finish each once, release a
dead runner's, and end the batch (finalizing, then completed; expired past its window).

A line is claimed by one runner at a time: `pending → running` is a conditional UPDATE (and, on PostgreSQL,
the pending rows are picked with SKIP LOCKED, so two runners claiming at once take different lines). It is
finished once: `running → completed | failed` matches only while the same runner holds it, and the batch's
counts move in that same transaction, so a retried finish neither counts nor bills twice (bill a line when
`batch_line_finish` returns True; its `request_id` is the usage record's, idempotent per (batch, custom_id)).
Locks are taken line first, then the batch (as `batch_cancel_settle` does), never the other way round.

A batch whose window ended (`batch_expire_settle`) has its pending lines `expired` at once and is claimed no
more; it stays `in_progress` while its running lines finish (OpenAI has no "expiring" state), and becomes
`expired` together with its output and error files once none runs: a client never sees an expired batch
without its files.
"""

from __future__ import annotations

from datetime import timedelta

from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from batches.models import Batch, BatchLine
from batches.services.batches import batch_cancel_settle
from batches.services.outputs import NOT_RUN, batch_files_attach, batch_files_write, files_discard
from batches.services.transitions import S, batch_transition
from batches.text import body_text, printable_copy

L = BatchLine.Status


def batch_lines_claim(*, batch: Batch, runner: str, limit: int) -> list[BatchLine]:
    """Up to `limit` pending lines of an in_progress batch within its window, in file order, now `running` for
    `runner` (a name unique among live runners); their `request_id` is set once, on the first claim, and kept on
    a retry. None of a batch past its `expires_at`: its lines left expire (batch_expire_settle)."""
    with transaction.atomic():
        pending = BatchLine.objects.filter(batch=batch, status=L.PENDING, batch__status=S.IN_PROGRESS,
                                           batch__expires_at__gt=timezone.now())
        if connection.features.has_select_for_update_skip_locked:
            pending = pending.select_for_update(skip_locked=True, of=("self",))
        ids = list(pending.order_by("line_no").values_list("pk", flat=True)[:limit])
        BatchLine.objects.filter(pk__in=ids, status=L.PENDING).update(
            status=L.RUNNING, claimed_by=runner, claimed_at=timezone.now(), attempts=F("attempts") + 1)
        claimed = list(BatchLine.objects.filter(pk__in=ids, status=L.RUNNING, claimed_by=runner).order_by("line_no"))
        for line in claimed:
            if not line.request_id:
                line.request_id = f"{batch.public_id}-{line.line_no}"
                BatchLine.objects.filter(pk=line.pk).update(request_id=line.request_id)
    return claimed


def batch_line_finish(*, line: BatchLine, runner: str, status_code: int | None, body: dict | None,
                      error: dict | None = None) -> bool:
    """Record a claimed line's outcome (a 200 is `completed`, anything else `failed`) and count it in its
    batch; False when `runner` no longer holds it (finished already, released, or cancelled)."""
    done = L.COMPLETED if status_code == 200 and error is None else L.FAILED
    if error is not None:
        error = {key: printable_copy(value) if isinstance(value, str) else value for key, value in error.items()}
    with transaction.atomic():
        moved = BatchLine.objects.filter(pk=line.pk, status=L.RUNNING, claimed_by=runner).update(
            status=done, response_status=status_code, response_body=body_text(body) if body is not None else "",
            error=error, finished_at=timezone.now())
        if not moved:
            return False
        counter = "completed" if done == L.COMPLETED else "failed"
        Batch.objects.filter(pk=line.batch_id).update(**{counter: F(counter) + 1})
    return True


def batch_lines_release(*, runner: str, pks: list[int] | None = None) -> int:
    """A runner's running lines (all, or those of `pks`) back to `pending`, their request_id kept (billing
    stays idempotent): a dead runner's, or lines refused for now (rate limits, a full queue) to run later."""
    lines = BatchLine.objects.filter(status=L.RUNNING, claimed_by=runner)
    if pks is not None:
        lines = lines.filter(pk__in=pks)
    return lines.update(status=L.PENDING, claimed_by="", claimed_at=None)


def batch_lines_renew(*, runner: str) -> int:
    """The runner is alive: its running lines' leases start again now."""
    return BatchLine.objects.filter(status=L.RUNNING, claimed_by=runner).update(claimed_at=timezone.now())


def batch_lines_reap(*, lease_s: float, now=None) -> int:
    """Running lines whose runner stopped renewing them for `lease_s` (killed) back to `pending`: another runner
    runs them again under the same request id (a usage record already written for one stays the only one)."""
    stale = (now or timezone.now()) - timedelta(seconds=lease_s)
    return BatchLine.objects.filter(status=L.RUNNING, claimed_at__lt=stale).update(
        status=L.PENDING, claimed_by="", claimed_at=None)


def batch_window_ended(*, batch: Batch) -> bool:
    """Its completion window is over: past `expires_at`, or some of its lines expired already (by a process
    whose clock, or `batches_expire`'s `now`, ran ahead of this one's)."""
    return batch.expires_at <= timezone.now() or BatchLine.objects.filter(batch=batch, status=L.EXPIRED).exists()


def batch_expire_settle(*, batch: Batch, now=None) -> bool:
    """An in_progress batch whose window ended: its pending lines become `expired` (never run, never billed);
    once none is running, the batch is `expired` with its output and error files in the same UPDATE (True when
    this call moved it; files written by a call that another one beat are deleted). The runner calls this
    again as each running line of such a batch ends (batch_end_check); any number of calls, in any number of
    processes, move it once."""
    now = now or timezone.now()
    with transaction.atomic():
        BatchLine.objects.filter(batch=batch, status=L.PENDING, batch__status=S.IN_PROGRESS).update(
            status=L.EXPIRED, error=NOT_RUN[L.EXPIRED], finished_at=now)
        if BatchLine.objects.filter(batch=batch, status=L.RUNNING).exists():
            return False  # stays in_progress, claimed no more; the runner's settle after its last line ends it
        # its files with the move: a client that sees `expired` finds them (never an expired batch without)
        output, errors = batch_files_write(batch=batch)
        if batch_transition(batch=batch, to=S.EXPIRED, output_file=output, error_file=errors):
            return True
    files_discard(output, errors)
    return False


def batch_end_check(*, batch: Batch) -> str:
    """Move a batch on once its lines allow: an in_progress batch with no pending or running line to
    `finalizing` (the runner then writes its files: batches.services.outputs.batch_files_attach, which completes it);
    one past its window to `expired` with its files once none runs; a cancelling one to `cancelled` once none
    runs. Returns the batch's status."""
    batch.refresh_from_db()
    if batch.status == S.CANCELLING:
        batch_cancel_settle(batch=batch)
    elif batch.status == S.IN_PROGRESS:
        if batch_window_ended(batch=batch):
            batch_expire_settle(batch=batch)
        elif not BatchLine.objects.filter(batch=batch, status__in=(L.PENDING, L.RUNNING)).exists():
            batch_transition(batch=batch, to=S.FINALIZING)
    batch.refresh_from_db()
    return batch.status


def batch_settle(*, batch: Batch) -> str:
    """After a line of `batch` ended, or when none was left to claim: move it on (batch_end_check: a cancelled
    or expired batch gets its files with the move), and write a finalizing batch's files (it is then
    `completed`). Returns the batch's status."""
    status = batch_end_check(batch=batch)
    if status == S.FINALIZING:
        batch_files_attach(batch=batch)
    elif status == S.EXPIRED and batch.output_file_id is None and batch.error_file_id is None:
        # expired by an earlier release, which moved it first and attached the files after its last line
        if not BatchLine.objects.filter(batch=batch, status=L.RUNNING).exists():
            batch_files_attach(batch=batch)
    batch.refresh_from_db()
    return batch.status


def batches_expire(*, now=None) -> int:
    """In-progress batches past their window (at `now`): their pending lines `expired` at once, and each batch
    `expired` with its files once none of its lines runs (now, or when the runner ends the last:
    batch_expire_settle). Idempotent: run again, it only ends those whose last line has ended since. Returns
    how many batches this call moved to `expired`."""
    now = now or timezone.now()
    expired = 0
    for batch in Batch.objects.filter(status=S.IN_PROGRESS, expires_at__lte=now).order_by("pk"):
        expired += batch_expire_settle(batch=batch, now=now)
    return expired
