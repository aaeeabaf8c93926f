"""Before a job is queued: is a worker serving its model? (`capacity_check`)

The worker pool (inference.serving) is asked to start the model (an engine in this process starts in its
thread; one this process does not serve, not in SERVE_MODELS, is refused at once). Separate workers are
known by their heartbeats: a request for a model with none waits up to settings.MODEL_WAIT_S for one (a
worker starting, or restarting after a deploy) and then gets 503 `model_unavailable` with Retry-After: never
a request queued for a model nobody serves, and never a wait without end.

The check is two steps a caller may take apart (`capacity_ready`, which never waits, then `capacity_wait`):
the WebSocket admits a socket's frames one at a time, in arrival order, and a frame whose model has no
worker waits for one out of that line (inference.consumers). The requests of this process waiting for the
same model share one poll of the heartbeats and are answered in the order they began to wait.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
import weakref

from django.conf import settings

from common.cache import TtlCache
from common.outage import Outage
from inference.serving import RETRY_AFTER_S, get_worker_pool, model_unavailable

__all__ = ["RETRY_AFTER_S", "capacity_check", "capacity_ready", "capacity_wait", "model_unavailable", "queue_outage"]

logger = logging.getLogger(__name__)

LIVE_WORKERS_TTL_S = 2.0  # how long a "yes, a worker serves this model" is trusted
LIVE_WORKERS_RECHECK_S = 0.25  # a request after a yes this old re-checks it in the background
WAIT_POLL_S = 0.25  # while waiting for a worker: how often the heartbeats are read again

# model -> True while a worker is known to serve it; a "no" is never stored
_live_workers: TtlCache[str, bool] = TtlCache("live workers", ttl=lambda: LIVE_WORKERS_TTL_S, max_entries=1024)
_live_rechecks = _live_workers.reloads  # model -> a background re-check in flight
_queue_outage = Outage(logger, "web: job queue (Redis)")
# event loop -> model -> the requests waiting for a worker of it: [(deadline, future)], in the order they came
_waiting: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_polls: set[asyncio.Task] = set()  # the polls running (a task nobody references may be collected)


async def capacity_check(model: str) -> None:
    """Return once a worker serves `model` (at once, or within settings.MODEL_WAIT_S); else 503."""
    if not await capacity_ready(model):
        await capacity_wait(model)


async def capacity_ready(model: str) -> bool:
    """Whether `model` is served now, never waiting for a worker: False when no heartbeat says so (at most one
    read of them). Raises what the pool's `start` raises (a model this process will not serve)."""
    pool = get_worker_pool()
    pool.start(model)  # on the event loop on purpose (an engine in this process delivers on it)
    if not pool.has_heartbeats:
        return True
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
        return True
    return await _live_workers_check(model)


async def capacity_wait(model: str) -> None:
    """After `capacity_ready` said no: wait up to settings.MODEL_WAIT_S for a worker of `model`, else 503."""
    if not await _live_workers_wait(model, max(0.0, float(settings.MODEL_WAIT_S))):
        raise model_unavailable(model)


async def _live_workers_wait(model: str, wait_s: float) -> bool:
    """Whether a worker serves `model` within `wait_s` seconds (the heartbeats are read every WAIT_POLL_S,
    first one interval from now: the caller has just read them). One poll per model serves every request
    waiting for it, and a worker seen answers them in the order they began to wait."""
    if wait_s <= 0:
        return False
    loop = asyncio.get_running_loop()
    by_model = _waiting.setdefault(loop, {})
    waiters = by_model.get(model)
    if waiters is None:
        waiters = by_model[model] = []
        poll = loop.create_task(_poll(model, waiters, by_model))
        _polls.add(poll)
        poll.add_done_callback(_polls.discard)
    answer = loop.create_future()
    waiters.append((loop.time() + wait_s, answer))
    token = await _demand_add(model, wait_s)
    try:
        return await answer  # cancelled (the client left): the poll skips it
    finally:
        if token is not None:
            _demand_remove(model, token)


async def _demand_add(model: str, wait_s: float) -> str | None:
    """Count this request as waiting for a worker of `model` (llmp:requests_waiting_for_worker: what scales a
    model up from zero replicas, deploy/docs/kubernetes.md). Advisory: a queue that fails here is not this
    request's error (the poll reports it)."""
    from inference.queue import get_job_queue

    token = uuid.uuid4().hex
    try:
        await asyncio.to_thread(get_job_queue().demand_add, model, token, time.time() + wait_s)
    except Exception:  # noqa: BLE001
        logger.debug("could not count a request waiting for %s", model, exc_info=True)
        return None
    return token


def _demand_remove(model: str, token: str) -> None:
    """In a thread, without waiting for it (the entry also lapses at its deadline)."""
    from inference.queue import get_job_queue

    def remove() -> None:
        try:
            get_job_queue().demand_remove(model, token)
        except Exception:  # noqa: BLE001
            logger.debug("could not uncount a request waiting for %s", model, exc_info=True)

    asyncio.get_running_loop().run_in_executor(None, remove)


async def _poll(model: str, waiters: list[tuple[float, asyncio.Future]], by_model: dict) -> None:
    """Read `model`'s heartbeats for its waiters until each has its answer: True (in their order) once a worker
    is seen, False at its own deadline; QueueUnavailable (503) to all when the queue cannot be reached."""
    loop = asyncio.get_running_loop()
    try:
        while True:
            waiters[:] = [(deadline, answer) for deadline, answer in waiters if not answer.done()]
            if not waiters:
                return
            await asyncio.sleep(max(0.0, min(WAIT_POLL_S, min(d for d, _ in waiters) - loop.time())))
            served = await _live_workers_check(model)
            now = loop.time()
            for deadline, answer in waiters:
                if not answer.done() and (served or deadline <= now):
                    answer.set_result(served)
    except Exception as exc:  # QueueUnavailable (logged once by the check): each waiter gets its 503
        for _deadline, answer in waiters:
            if not answer.done():
                answer.set_exception(exc)
    except BaseException:  # the loop is closing: nobody is left waiting for ever
        for _deadline, answer in waiters:
            answer.cancel()
        raise
    finally:
        if by_model.get(model) is waiters:
            del by_model[model]


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
