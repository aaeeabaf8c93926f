"""Who serves this web process's jobs, decided once: separate worker processes or the engine in this process.

`get_worker_pool()` is the one reader of settings.EMBEDDED_WORKER; it builds

- `SeparateWorkers` (production): `manage.py run_worker` processes, known by their heartbeats in the
  queue's store. The web checks that one serves a model before it enqueues, while a request waits for
  events, and in /readyz; their events come through the channel layer.
- `EmbeddedWorkers` (inference.worker.embedded; the default without REDIS_URL): the engine loop in a
  thread of this process, started by the first request, which hands its events to this process's reply
  channels directly: the pool gives its engine's event sink the reply channels this process opens
  (`reply_channel_opened`; inference.worker.events.LocalReceivers).

The API, its job events and /readyz (`readiness` below) ask the pool for what they need (start serving
a model, whether heartbeats say which models are served, where a reply channel's in-process events go);
none of them asks which mode runs, and none imports the worker (import-linter: web-without-worker).
Like `get_job_queue`, the pool is built on first use; tests that change settings.EMBEDDED_WORKER get a
new one (the `setting_changed` hook below).
"""

from __future__ import annotations

import functools
from typing import Any, Protocol

from django.core.signals import setting_changed

from common.errors import ServiceUnavailable

RETRY_AFTER_S = 5  # what a 503 for a model nobody serves now tells the client to wait


def model_unavailable(model: str, *, why: str = "no worker has it loaded",
                      code: str = "model_unavailable") -> ServiceUnavailable:
    """The 503 of a request for a model no worker serves now (`why`), with Retry-After: defined here, in the
    seam both the web side (inference.api) and the worker pools (inference.worker.embedded) import."""
    return ServiceUnavailable(f"The model `{model}` is not being served right now ({why}). Please retry later.",
                              code=code, headers={"Retry-After": str(RETRY_AFTER_S)})


class WorkerPool(Protocol):
    """What the web process needs of the workers that serve its jobs."""

    # True: the workers are separate processes whose heartbeats (JobQueue.live_workers) say which models
    # are served, so a request checks them. False: the engine serves in this process once started.
    has_heartbeats: bool

    def start(self, model: str) -> None:
        """Make sure `model`'s jobs will be served; called on the web's event loop before each enqueue,
        cheap after the first call. Raises `model_unavailable` (above) when that cannot be."""

    def reply_channel_opened(self, name: str, receiver: Any) -> None:
        """This process's reply channel `name` opened; `receiver` (inference.api.replies.ReplyChannel)
        reads it on `receiver.loop` and takes a worker's `Batch` through `receiver.deliver`."""

    def readiness(self, model: str) -> dict[str, str]:
        """What /readyz reports of the workers of `model` (and of what reaches them): "ok" or why not."""

    async def still_served(self, model: str) -> bool:
        """While a request waits for its events: False once nothing will serve `model`'s queued jobs (no live
        worker; an engine in this process that failed to load), so the request ends with a 503 instead of
        waiting for ever. Raises what asking raises (the caller logs it and asks again later)."""


class SeparateWorkers:
    """`run_worker` processes: they start themselves and send their events through the channel layer."""

    has_heartbeats = True

    def start(self, model: str) -> None:
        pass  # they run or they do not: the caller asks their heartbeats

    def reply_channel_opened(self, name: str, receiver: Any) -> None:
        pass  # their events come through the channel layer

    async def still_served(self, model: str) -> bool:
        import asyncio

        from inference.queue import get_job_queue

        return bool(await asyncio.to_thread(get_job_queue().live_workers, model))

    def readiness(self, model: str) -> dict[str, str]:
        """The queue's Redis, and a worker whose heartbeat says "serving" (its model is loaded)."""
        from inference.queue import get_job_queue

        checks: dict[str, str] = {}
        try:
            workers = get_job_queue().live_workers(model)
            checks["redis"] = "ok"
        except Exception as exc:  # noqa: BLE001 - QueueUnavailable, or anything Redis raised
            checks["redis"] = f"unavailable: {exc.__cause__ or exc}"[:200]
            checks["workers"] = "unknown"
            return checks
        serving = [w for w in workers if w.get("status") == "serving"]
        checks["workers"] = "ok" if serving else f"no worker serves {model} ({len(workers)} loading or draining)"
        return checks


def readiness(*, model: str) -> dict[str, str]:
    """What /readyz reports: "ok" or why not, for the database and for the workers of `model` (separate
    ones: the queue's Redis and a serving heartbeat; an engine in this process serves once asked)."""
    from inference.selectors import database_check

    return {**database_check(), **get_worker_pool().readiness(model)}


@functools.cache
def get_worker_pool() -> WorkerPool:
    """The process-wide worker pool, built on first use from settings.EMBEDDED_WORKER. (Both pools keep
    their state at module level, so one built twice by racing threads is still the same pool.)"""
    from django.conf import settings

    if settings.EMBEDDED_WORKER:
        # the one import of the worker on the web side: the engine's modules load only in this mode
        from inference.worker.embedded import EmbeddedWorkers

        return EmbeddedWorkers()
    return SeparateWorkers()


def reset_worker_pool() -> None:
    """Forget the pool so the next call rebuilds it from settings (tests; an embedded engine keeps running)."""
    get_worker_pool.cache_clear()


def _setting_changed(*, setting: str, **_kwargs: Any) -> None:
    if setting == "EMBEDDED_WORKER":
        reset_worker_pool()


setting_changed.connect(_setting_changed, dispatch_uid="inference.serving.reset_worker_pool")
