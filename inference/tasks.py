"""Celery tasks of the inference app (thin: each calls one service)."""

from __future__ import annotations

from celery import shared_task


@shared_task(name="inference.tasks.reap_dead_workers", ignore_result=True)
def reap_dead_workers() -> dict:
    """Requeue or fail the leases of workers whose heartbeat expired.

    Idempotent and safe next to the workers' own reaping: the queue hands each
    dead worker's leases to exactly one caller.
    """
    from inference.queue import get_job_queue
    from inference.worker.events import default_sink
    from inference.worker.reaper import dead_workers_reap

    sink = default_sink()
    result = dead_workers_reap(queue=get_job_queue(), sink=sink)
    sink.flush(timeout=10.0)
    return {"dead_workers": result.dead_workers, "requeued": len(result.requeued), "failed": len(result.failed)}
