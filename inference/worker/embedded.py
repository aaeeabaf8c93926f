"""The embedded worker: the engine loop in a daemon thread of the web process.

The worker pool of the embedded mode (`EmbeddedWorkers`, which inference.serving
builds when settings.EMBEDDED_WORKER is true, the default without REDIS_URL).
The API calls its `start()` from its event loop before it enqueues, which calls
`ensure_embedded_worker()`: the first call starts the thread, which heartbeats
at once (so the model counts as served while it loads) and loads the engine
lazily; every call records the running event loop, on which the in-memory
channel layer's events are then delivered (inference.worker.events). Each
reply channel the web process opens is added to the receivers the embedded
sink is built with (`reply_channel_opened`, `_receivers`): the engine thread
hands it its batches directly. Separate workers' sinks have none.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

from typing import Any

from django.conf import settings

from inference.queue import get_job_queue
from inference.serving import model_unavailable

from .engine_factory import engine_build
from .events import EventSink, LocalReceivers, bind_event_loop, bound_event_loop
from .loop import WorkerLoop, default_worker_id

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_workers: dict[str, tuple[WorkerLoop, threading.Thread]] = {}
_sink: EventSink | None = None
# this process's reply channels: the embedded sink delivers to them in-process (kept with the workers and
# their sink, not with one pool object: a pool rebuilt after a settings change reaches the running engine)
_receivers = LocalReceivers()


# model -> (when, why) its engine last failed to load: requests meanwhile get a 503 instead of a queued job
# nobody takes; a load is tried again LOAD_RETRY_S after the failure
_load_failures: dict[str, tuple[float, str]] = {}
LOAD_RETRY_S = 30.0


def _run(loop: WorkerLoop) -> None:
    try:
        loop.run()
    except Exception as exc:  # noqa: BLE001 - logged; the next ensure_embedded_worker() starts a new one
        logger.exception("embedded worker %s crashed", loop.worker_id)
        if loop.engine is None:  # the model did not load (files gone, unsupported, out of memory)
            _load_failures[loop.model] = (time.monotonic(), str(exc) or type(exc).__name__)


def _load_failure_check(model: str) -> None:
    failure = _load_failures.get(model)
    if failure is not None and time.monotonic() - failure[0] < LOAD_RETRY_S:
        raise RuntimeError(f"the model `{model}` failed to load: {failure[1]}")


def ensure_embedded_worker(model: str | None = None) -> WorkerLoop:
    """Start (once) the engine thread serving `model` (default settings.DEFAULT_MODEL): one thread, engine and
    queue (the job queue's, keyed by model) per model, so SERVE_MODELS=a,b serves both from this process."""
    global _sink
    try:
        bind_event_loop(asyncio.get_running_loop())
    except RuntimeError:
        pass  # called outside an event loop: keep the loop bound earlier
    model = model or settings.DEFAULT_MODEL
    entry = _workers.get(model)
    if entry is not None and entry[1].is_alive():
        return entry[0]
    _load_failure_check(model)
    with _lock:
        entry = _workers.get(model)
        if entry is not None and entry[1].is_alive():
            return entry[0]
        if _sink is None:
            _sink = EventSink(loop=bound_event_loop, local=_receivers)
        device = settings.ENGINE_DEVICE
        worker = WorkerLoop(
            queue=get_job_queue(),
            model=model,
            sink=_sink,
            engine_factory=lambda: engine_build(model=model, device=device),
            device=device,
            max_num_seqs=settings.ENGINE_MAX_NUM_SEQS,
            worker_id="embedded:" + default_worker_id(model),
        )
        thread = threading.Thread(target=_run, args=(worker,), name=f"embedded-worker-{model}", daemon=True)
        _workers[model] = (worker, thread)
        thread.start()
        return worker


def embedded_worker_stop(timeout: float = 30.0) -> None:
    """Drain and join the embedded workers (tests, orderly shutdown)."""
    with _lock:
        entries = list(_workers.values())
        _workers.clear()
        _load_failures.clear()
    for worker, _thread in entries:
        worker.request_drain()
    for _worker, thread in entries:
        thread.join(timeout)


class EmbeddedWorkers:
    """The worker pool (inference.serving.WorkerPool) of an engine in this process: started by the first
    request, delivering to this process's reply channels."""

    has_heartbeats = False  # it serves once started; nothing to ask the queue's store

    def start(self, model: str) -> None:
        # Called on the event loop on purpose: it records this loop, on which the engine thread
        # delivers in-memory channel-layer events. Idempotent and cheap after the first call (the
        # engine itself loads in its thread).
        from inference.served_models import serve_models

        served = serve_models()
        if model not in served:  # no engine of it here, nor one to come: no use waiting
            raise model_unavailable(model, why=f"this server serves {', '.join(served)}; SERVE_MODELS")
        try:
            ensure_embedded_worker(model)
        except Exception as exc:
            raise model_unavailable(model, why=f"the embedded engine could not start: {exc}") from exc

    @property
    def receivers(self) -> LocalReceivers:
        """This process's reply channels, which the embedded engine's sink hands their batches directly."""
        return _receivers

    def reply_channel_opened(self, name: str, receiver: Any) -> None:
        _receivers.register(name, receiver)

    def readiness(self, model: str) -> dict[str, str]:
        return {}  # no Redis, and the engine serves from its own thread once asked

    async def still_served(self, model: str) -> bool:
        """False when `model`'s engine thread is gone after its model failed to load: the jobs queued for it
        would wait for ever (a later request starts a new thread, after LOAD_RETRY_S)."""
        entry = _workers.get(model)
        return not (entry is not None and not entry[1].is_alive() and model in _load_failures)
