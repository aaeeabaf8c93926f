"""Before a job is queued: is a worker serving its model? (`capacity_check`)

The worker pool (inference.serving) is asked to start the model (an engine in this process starts in its
thread; one this process does not serve, not in SERVE_MODELS, is refused at once). Separate workers are
known by their heartbeats: a request for a model with none waits up to settings.MODEL_WAIT_S for one (a
worker starting, or restarting after a deploy) and then gets 503 `model_unavailable` with Retry-After: never
a request queued for a model nobody serves, and never a wait without end.
"""

from __future__ import annotations

import asyncio
import logging
import time

from django.conf import settings

from common.cache import TtlCache
from common.errors import ServiceUnavailable
from common.outage import Outage
from inference.serving import get_worker_pool

logger = logging.getLogger(__name__)

LIVE_WORKERS_TTL_S = 2.0  # how long a "yes, a worker serves this model" is trusted
LIVE_WORKERS_RECHECK_S = 0.25  # a request after a yes this old re-checks it in the background
WAIT_POLL_S = 0.25  # while waiting for a worker: how often the heartbeats are read again
RETRY_AFTER_S = 5

# model -> True while a worker is known to serve it; a "no" is never stored
_live_workers: TtlCache[str, bool] = TtlCache("live workers", ttl=lambda: LIVE_WORKERS_TTL_S, max_entries=1024)
_live_rechecks = _live_workers.reloads  # model -> a background re-check in flight
_queue_outage = Outage(logger, "web: job queue (Redis)")


def model_unavailable(model: str) -> ServiceUnavailable:
    return ServiceUnavailable(
        f"The model `{model}` is not being served right now (no worker has it loaded). Please retry later.",
        code="model_unavailable", headers={"Retry-After": str(RETRY_AFTER_S)},
    )


async def capacity_check(model: str) -> None:
    pool = get_worker_pool()
    pool.start(model)  # on the event loop on purpose (an engine in this process delivers on it)
    if not pool.has_heartbeats:
        return
    # Heartbeats come every second; trusting a positive answer for two more
    # seconds spares a Redis round trip per request, and a request that finds
    # the answer older than a quarter second re-checks it in the background, so
    # while requests keep coming none of them waits for Redis here (a re-check
    # started only late in the TTL would often come too late for a steady
    # client). A request that slips in after the last worker died
    # waits on the queue, and JobRun's idle liveness check ends it with a 503.
    known = _live_workers.entry(model)
    if known is not None:
        if _live_workers.age(known) > LIVE_WORKERS_RECHECK_S:
            _live_rechecks.start(model, lambda: _live_workers_recheck(model))
        return
    if await _live_workers_wait(model, max(0.0, float(settings.MODEL_WAIT_S))):
        return
    raise model_unavailable(model)


async def _live_workers_wait(model: str, wait_s: float) -> bool:
    """Whether a worker serves `model` now or within `wait_s` seconds (asked every WAIT_POLL_S)."""
    deadline = time.monotonic() + wait_s
    while True:
        if await _live_workers_check(model):
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        await asyncio.sleep(min(WAIT_POLL_S, left))


async def _live_workers_check(model: str) -> bool:
    """Ask the queue whether a worker serves `model`; remember a yes for LIVE_WORKERS_TTL_S.
    Raises QueueUnavailable (503 with Retry-After) when the queue cannot be reached."""
    from inference.queue import QueueUnavailable, get_job_queue

    try:
        workers = await asyncio.to_thread(get_job_queue().live_workers, model)
    except QueueUnavailable as exc:
        _live_workers.invalidate(model)
        _queue_outage.failed(exc.__cause__ or exc)
        raise
    _queue_outage.ok()
    if workers:
        _live_workers.set(model, True)
    else:
        _live_workers.invalidate(model)
    return bool(workers)


async def _live_workers_recheck(model: str) -> None:
    """The background re-check: an unreachable queue is already logged (once) and forgotten."""
    from inference.queue import QueueUnavailable

    try:
        await _live_workers_check(model)
    except QueueUnavailable:
        pass


def queue_outage() -> Outage:
    """The job queue's outage log, shared with the enqueue (inference.api.services)."""
    return _queue_outage
