"""Reading one job's engine events, demultiplexed from its web process's reply channel.

`JobRun` is an async context manager: leaving it before the job's
`engine.done` arrived (client disconnect, cancellation, an exception) tells the
queue to cancel the job, so the engine aborts it within a step and bills only
what it generated.

The events come from this process's shared reply channel
(inference.api.replies), which routes each one by request id to the JobRun
registered for it. Waiting with a timeout only waits on that in-process queue.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import AsyncIterator

from django.conf import settings

from common.errors import ApiError, InvalidRequest, ServiceUnavailable

logger = logging.getLogger(__name__)

LIVENESS_INTERVAL_S = 5.0  # while idle, how often to check that a worker still serves the model


def keepalive_s() -> float:
    """Idle seconds between keep-alive ticks (settings.SSE_KEEPALIVE_S, default 15)."""
    return float(getattr(settings, "SSE_KEEPALIVE_S", 15.0))


class EngineFailed(ApiError):
    """The worker reported an error (it died, or the engine raised) after the job was accepted."""

    status_code = 500
    error_type = "server_error"
    code = "engine_error"


def _cancel_quietly(request_id: str) -> None:
    try:
        from inference.queue import get_job_queue

        get_job_queue().cancel(request_id)
    except Exception:  # best effort: the worker also sees the reply channel go stale
        logger.exception("cancelling job %s failed", request_id)


def job_cancel(*, request_id: str) -> None:
    """Ask the queue to cancel `request_id` without blocking the event loop."""
    try:
        asyncio.get_running_loop().run_in_executor(None, _cancel_quietly, request_id)
    except RuntimeError:  # no running loop
        _cancel_quietly(request_id)


class JobRun:
    """The events of one queued job: `engine.delta`s, then exactly one `engine.done`.

    Registered on `reply` when made (before the job is queued, so no event can
    arrive before anyone waits for it); unregistered by `aclose()`.
    """

    def __init__(self, *, reply, request_id: str, model: str) -> None:
        self.reply = reply
        self.channel = reply.name
        self.request_id = request_id
        self.model = model
        self.done: dict | None = None
        self.cancelled = False
        self._mailbox = reply.register(request_id)
        self._closed = False
        self._next_liveness = time.monotonic() + LIVENESS_INTERVAL_S

    async def __aenter__(self) -> "JobRun":
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        await self.aclose()

    def cancel(self) -> None:
        """Cancel the job in the queue/engine; its `engine.done` ("abort") still arrives."""
        if self.done is None and not self.cancelled:
            self.cancelled = True
            job_cancel(request_id=self.request_id)

    def release(self) -> None:
        """Stop receiving this job's events (without cancelling it: e.g. it was never queued)."""
        if not self._closed:
            self._closed = True
            self.reply.unregister(self.request_id)  # closes the mailbox: a reader waiting now is cancelled

    async def aclose(self) -> None:
        self.cancel()
        self.release()

    async def next_event(self, timeout: float | None) -> dict | None:
        """The next event of this job, or None when `timeout` seconds pass without one."""
        if not await self._mailbox.wait(timeout):
            return None  # nothing is taken while waiting: no event is lost between ticks
        message = self._mailbox.get_nowait()
        if message.get("type") == "engine.done":
            self.done = message
        return message

    async def events(self, *, idle_s: float | None = None) -> AsyncIterator[dict | None]:
        """Yield events until `engine.done` (included); None on every `idle_s` without one.

        While idle, a job whose model has no live worker left (separate worker
        processes only) is cancelled and ends with a 503 instead of waiting forever.
        """
        idle_s = idle_s or keepalive_s()
        while self.done is None:
            event = await self.next_event(idle_s)
            if event is None:
                await self._liveness_check()
            yield event

    async def _liveness_check(self) -> None:
        if settings.EMBEDDED_WORKER or self.cancelled:
            return
        now = time.monotonic()
        if now < self._next_liveness:
            return
        self._next_liveness = now + LIVENESS_INTERVAL_S
        from inference.queue import get_job_queue

        try:
            workers = await asyncio.to_thread(get_job_queue().live_workers, self.model)
        except Exception:
            logger.exception("worker liveness check failed")
            return
        if not workers:
            self.cancel()
            raise ServiceUnavailable(
                f"No worker is serving the model `{self.model}` any more. Please retry later.", code="no_worker"
            )


_PARAM_SUFFIX = re.compile(r"^(?P<message>.*) \(param: (?P<param>[\w.\[\]]+)\)$", re.DOTALL)


def done_error(done: dict) -> ApiError | None:
    """The error a finished job ended with, if any (an `abort` we did not ask for counts).

    The engine re-validates each request when the worker adds it; a failure
    there names the parameter (`error_param`, or the worker's "... (param: X)"
    suffix) and is the client's fault: 400, not 500.
    """
    reason = done.get("finish_reason")
    if reason == "error":
        error = str(done.get("error") or "unknown error")
        param = done.get("error_param")
        match = _PARAM_SUFFIX.match(error)
        if param is None and match is not None:
            error, param = match.group("message"), match.group("param")
        if param:
            return InvalidRequest(error, param=param, code="invalid_value")
        return EngineFailed(f"The engine failed while generating: {error}")
    if reason == "abort":
        return EngineFailed("The request was aborted by the server before it finished.", code="aborted")
    return None
