"""Celery tasks of the batches app (thin: each calls one service; all idempotent)."""

from __future__ import annotations

from celery import shared_task


@shared_task(name="batches.tasks.validate_batch", ignore_result=True, acks_late=True)
def validate_batch(*, batch_id: int) -> str | None:
    """Check a `validating` batch's input file: its lines stored and the batch in_progress, or failed."""
    from batches.services.validation import batch_validate

    batch = batch_validate(batch_id=batch_id)
    return batch.status if batch is not None else None


@shared_task(name="batches.tasks.validate_pending", ignore_result=True)
def validate_pending() -> int:
    """Validate the batches whose task was lost (a broker down when they were made): still `validating` a
    minute after they were created."""
    from batches.services.validation import batches_validate_stale

    return batches_validate_stale()


@shared_task(name="batches.tasks.expire_batches", ignore_result=True)
def expire_batches() -> int:
    """In-progress batches past their completion window: their pending lines never run, each batch `expired`
    with its files once none of its lines runs (a running line's end settles it; this task, each minute, too)."""
    from batches.services.runs import batches_expire

    return batches_expire()
