"""Job queues between the web process and the workers (CONTRACTS section 4).

    from inference.queue import get_job_queue, Job, QueueFull
    q = get_job_queue()   # Redis when settings.REDIS_URL is set, else in-process

Semantics: base.JobQueue. Pull policy: selection. The small interfaces a queue is
made of: worker_registry.WorkerRegistry (`queue.workers`) and
reply_liveness.ReplyLiveness (`queue.replies`).
"""

from __future__ import annotations

import threading

from .base import JobQueue, QueueFull, QueueUnavailable, ReapResult
from .job import Job
from .reply_liveness import ReplyLiveness
from .worker_registry import WorkerRegistry

__all__ = ["Job", "JobQueue", "QueueFull", "QueueUnavailable", "ReapResult", "ReplyLiveness", "WorkerRegistry",
           "get_job_queue", "reset_job_queue"]

_queue: JobQueue | None = None
_lock = threading.Lock()


def _build() -> JobQueue:
    from django.conf import settings

    from .routing import RoutingPolicy
    from .selection import DbTierWeights

    options = {
        "routing": RoutingPolicy.from_settings(),
        "weights": DbTierWeights(),
        "max_depth": settings.QUEUE_MAX_DEPTH,
        "heartbeat_timeout": settings.WORKER_HEARTBEAT_TIMEOUT_S,
    }
    if settings.REDIS_URL:
        from .redis_backend import RedisJobQueue

        return RedisJobQueue(url=settings.REDIS_URL, prefix=settings.QUEUE_KEY_PREFIX, **options)
    from .memory import MemoryJobQueue

    return MemoryJobQueue(**options)


def get_job_queue() -> JobQueue:
    """The process-wide queue client (built on first use, thread-safe)."""
    global _queue
    if _queue is None:
        with _lock:
            if _queue is None:
                _queue = _build()
    return _queue


def reset_job_queue() -> None:
    """Forget the singleton so the next call rebuilds it from settings (tests)."""
    global _queue
    with _lock:
        _queue = None
