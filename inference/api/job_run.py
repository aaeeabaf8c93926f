"""Reading one job's events (inference.protocol), demultiplexed from its web process's reply
channel, and the response chunks they make.

`JobRun` is an async context manager: leaving it before the job's `Done`
arrived (client disconnect, cancellation, an exception) tells the queue to
cancel the job, so the engine aborts it within a step and bills only what it
generated.

The events come from this process's shared reply channel
(inference.api.replies), which routes each one by request id to the JobRun
registered for it. Waiting with a timeout only waits on that in-process queue.

`job_chunks` is the one reader of a JobRun's events: the JSON body, the SSE
stream and the WebSocket frames are all made from the chunks it yields.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

from django.conf import settings

from common.errors import ApiError, InvalidRequest, ServiceUnavailable
from inference.api.responses import ResponseBuilder
from inference.api.schemas import api_param
from inference.protocol import Delta, Done, Event
from inference.serving import get_worker_pool, model_unavailable

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


class EventsLost(ServiceUnavailable):
    """Events of a running job never reached this process (the channel layer lost them): the stream
    ends with this error, never with `[DONE]` over missing text; the message states what was billed."""

    code = "stream_interrupted"


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
    """The events of one queued job: `Delta`s, then exactly one `Done`.

    Registered on `reply` when made (before the job is queued, so no event can
    arrive before anyone waits for it); unregistered by `aclose()`.
    """

    def __init__(self, *, reply, request_id: str, model: str) -> None:
        self.reply = reply
        self.channel = reply.name
        self.request_id = request_id
        self.model = model
        self.done: Done | None = None
        self.cancelled = False
        self.next_seq = 1  # the number of the next event expected (inference.protocol)
        self.missing: tuple[int, int] | None = None  # [first, last] numbers that never came
        self.delivered_tokens = 0  # completion tokens of the deltas handed on
        self._mailbox = reply.register(request_id)
        self._closed = False
        self._next_liveness = time.monotonic() + LIVENESS_INTERVAL_S

    async def __aenter__(self) -> "JobRun":
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        await self.aclose()

    def cancel(self) -> None:
        """Cancel the job in the queue/engine; its `Done` ("abort") still arrives."""
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

    async def next_event(self, timeout: float | None) -> Event | None:
        """The next event of this job, or None when `timeout` seconds pass without one.

        Checks the sequence numbers: a number already seen (a resend) is dropped; a number past
        the next one expected means events were lost: the job is cancelled (nobody can be given
        coherent text any more), later deltas are dropped, and `missing` says which numbers never
        came; `job_chunks` then ends with `EventsLost` once the `Done` arrives.
        """
        while True:
            if not await self._mailbox.wait(timeout):
                return None  # nothing is taken while waiting: no event is lost between ticks
            event = self._mailbox.get_nowait()
            seq = event.seq
            if seq:
                if seq < self.next_seq:
                    continue
                if seq > self.next_seq and self.missing is None:
                    self.missing = (self.next_seq, seq - 1)
                    logger.error("request %s: events %d-%d never arrived; cancelling it", self.request_id,
                                 self.next_seq, seq - 1)
                    self.cancel()
                self.next_seq = seq + 1
            if type(event) is Done:
                self.done = event
            elif self.missing is not None:
                continue
            else:
                self.delivered_tokens += len(event.token_ids)
            return event

    async def events(self, *, idle_s: float | None = None) -> AsyncIterator[Event | None]:
        """Yield events until the `Done` (included); None on every `idle_s` without one.

        While idle, a job whose model has no live worker left (workers with
        heartbeats only: inference.serving) is cancelled and ends with a 503 instead of waiting forever.
        """
        idle_s = idle_s or keepalive_s()
        while self.done is None:
            event = await self.next_event(idle_s)
            if event is None:
                await self._liveness_check()
            yield event

    async def _liveness_check(self) -> None:
        if self.cancelled:
            return
        now = time.monotonic()
        if now < self._next_liveness:
            return
        self._next_liveness = now + LIVENESS_INTERVAL_S
        try:
            served = await get_worker_pool().still_served(self.model)
        except Exception:
            logger.exception("worker liveness check failed")
            return
        if not served:
            self.cancel()
            raise model_unavailable(self.model, why="no worker serves it any more", code="no_worker")


def done_error(done: Done, *, endpoint: str, max_tokens_param: str = "max_tokens") -> ApiError | None:
    """The error a finished job ended with, if any (an `abort` we did not ask for counts).

    The engine re-validates each request when the worker adds it; a failure
    there names the parameter (`error_param`, in the engine's names) and is the
    client's fault: 400 for the client's name of that parameter, not 500.
    """
    reason = done.finish_reason
    if reason == "error":
        error = done.error or "unknown error"
        if done.error_param:
            param = api_param(done.error_param, endpoint=endpoint, max_tokens_param=max_tokens_param)
            return InvalidRequest(error, param=param, code="invalid_value")
        return EngineFailed(f"The engine failed while generating: {error}")
    if reason == "abort":
        return EngineFailed("The request was aborted by the server before it finished.", code="aborted")
    return None


def events_lost(run: JobRun) -> EventsLost:
    usage = run.done.usage
    first, last = run.missing
    return EventsLost(
        f"The stream was interrupted: events {first}-{last} of this request were lost between the worker and "
        f"this server, so the text you received is incomplete ({run.delivered_tokens} of "
        f"{usage.completion_tokens} generated tokens). Billed: {usage.prompt_tokens} prompt and "
        f"{usage.completion_tokens} completion tokens"
        + (f" ({usage.cost['total']} {usage.cost['currency'].upper()})." if usage.cost else ".")
        + " Please retry.",
        headers={"Retry-After": "1"},
    )


async def job_chunks(run: JobRun, builder: ResponseBuilder, *, keepalive: bool = False) -> AsyncIterator[dict | None]:
    """The response chunks of one job, in order: the role chunk (chat; sent with the first event, whose
    `system_fingerprint` every chunk then carries), a content chunk per `Delta` with text or logprobs
    (with tools: content and `delta.tool_calls` as the parser lets them out, and what it held back at the
    end), the finish chunk, then the usage chunk when `builder.include_usage`; with `keepalive`, None after
    each idle interval (settings.SSE_KEEPALIVE_S).

    Leaving early cancels the job (JobRun's context). A job that failed raises
    its ApiError after its content; one this side cancelled (`run.cancel()`, a
    client's cancel frame) ends after its content, without a finish chunk: its
    `Done` ("abort", with the usage of what it generated) is `run.done`.
    """
    async with run:
        role = True  # the role chunk still to send: with the first event, which carries the fingerprint
        async for event in run.events():
            if event is None:
                if keepalive:
                    yield None
                continue
            if role:
                role = False
                if type(event) is Delta and event.system_fingerprint:
                    builder.system_fingerprint = event.system_fingerprint
                first = builder.role_chunk()
                if first is not None:
                    yield first
            if type(event) is Delta and (event.text or event.logprobs):
                chunk = builder.delta_chunk(text=event.text, logprobs=event.logprobs)
                if chunk is not None:  # None: a tool parser holds the text back (a call's tag may be starting)
                    yield chunk
    done = run.done
    if run.missing is not None:
        raise events_lost(run)
    if done.finish_reason == "abort" and run.cancelled:
        return
    if role:  # no event came before the end
        first = builder.role_chunk()
        if first is not None:
            yield first
    error = done_error(done, endpoint=builder.endpoint, max_tokens_param=builder.max_tokens_param)
    if error is not None:
        raise error
    tail, finish_reason = builder.tools_finish(finish_reason=done.finish_reason)
    if tail is not None:
        yield tail
    yield builder.finish_chunk(finish_reason=finish_reason, timing=done.timing)
    if builder.include_usage:
        yield builder.usage_chunk(usage=done.usage)


async def job_collect(run: JobRun, builder: ResponseBuilder) -> dict:
    """Await a job to its end and build the whole response body (from the same chunks a stream gets): a
    non-streamed response's body, and a Batch API line's (batches.services.line_run)."""
    async with contextlib.aclosing(job_chunks(run, builder)) as chunks:  # closed (job cancelled) on any exit
        async for _chunk in chunks:
            pass
    return builder.collected(finish_reason=run.done.finish_reason, usage=run.done.usage)
