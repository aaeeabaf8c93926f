"""Ending the jobs nobody serves any more: a dead worker's started ones (the queue takes its leases
and requeues the rest), and the ones cancelled while still queued."""

from __future__ import annotations

import logging

from common.outage import connection_lost
from inference.queue import JobQueue, ReapResult

from .events import EventSink
from .finish import job_finish

logger = logging.getLogger(__name__)

DEAD_WORKER_ERROR = "The worker serving this request stopped unexpectedly."


def reap_result_finish(*, result: ReapResult, sink: EventSink, error: str = DEAD_WORKER_ERROR) -> None:
    """Fail every started job of `result`: usage record (idempotent) + error done event.

    The dead worker's token counts died with it: the record carries the prompt
    (it was processed) and no completion tokens.
    """
    for worker_id, job in result.failed:
        job_finish(
            job=job, sink=sink, worker_id=worker_id, finish_reason="error", error=error,
            prompt_tokens=len(job.prompt_token_ids),
        )


def dead_workers_reap(*, queue: JobQueue, sink: EventSink) -> ReapResult:
    """One reaping pass; safe to run from every worker and from Celery at once."""
    result = queue.reap_dead_workers()
    if result.dead_workers or result.failed:
        logger.warning(
            "reaped workers %s: %d jobs requeued, %d started jobs failed",
            result.dead_workers, len(result.requeued), len(result.failed),
        )
    reap_result_finish(result=result, sink=sink)
    return result


def dropped_jobs_finish(*, queue: JobQueue, sink: EventSink, model: str, worker_id: str) -> None:
    """End the jobs of `model` cancelled while still queued: an "abort" with no tokens, each once."""
    try:
        dropped = queue.take_dropped(model)
    except Exception as exc:  # noqa: BLE001
        if not connection_lost(exc):  # Redis away: the loop says so once (WorkerLoop.queue_outage)
            logger.exception("reading dropped jobs failed")
        return
    for job in dropped:
        job_finish(job=job, sink=sink, worker_id=worker_id, finish_reason="abort", error="Cancelled before it started.")
