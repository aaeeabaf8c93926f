"""The worker's ending thread (`Finisher`): the usage records, done events and lease releases of the
requests the engine finished, from a thread of its own (what one ending is: inference.worker.finish).

A usage record is a database round trip, slow at the tail; written on the
engine thread it would stall every stream's next token. So the loop hands each
step's finished requests over (`submit`) and steps on, while this thread, in
order, writes whatever finished since it last looked in one insert, then sends
their done events (each after its record, so a client that sees the end of its
stream can already find the record), then releases their leases in one call.

Backlog: when `backlog` hand-overs are still waiting, the loop waits for the
oldest: a database that cannot keep up slows the engine down instead of piling
finished requests up in memory.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from common.outage import connection_lost
from inference.queue import JobQueue

from .events import EventSink
from .finish import ActiveRequest, endings_record, job_ending

if TYPE_CHECKING:
    from billing.services.settlement import Ending
    from inference.protocol import Done

logger = logging.getLogger(__name__)

COMPLETE_ATTEMPTS = 8  # releasing leases through a Redis restart: about 10 s of retries


def output_ending(*, active: ActiveRequest, output: Any, now: float, worker_id: str) -> tuple[Ending, Done]:
    """(`Ending`, done event) of a request the engine finished (`output`: its last RequestOutput)."""
    job = active.job
    usage, timing = output.usage, output.timing
    engine_queued = float(getattr(timing, "queued_s", 0.0) or 0.0)
    return job_ending(
        job=job, worker_id=worker_id, finish_reason=output.finish_reason or "stop",
        prompt_tokens=int(usage.prompt_tokens), cached_tokens=int(usage.cached_tokens),
        completion_tokens=int(usage.completion_tokens),
        queued_s=max(0.0, active.leased_at - job.enqueued_at) + engine_queued,
        ttft_s=active.ttft_s, engine_timing=timing, now=now,
        error=getattr(output, "error", None),  # why, when the request failed alone inside the engine
        error_param=_error_param(job, output), seq=active.next_seq,
    )


def _error_param(job, output: Any) -> str | None:
    """The client's parameter a request that failed alone inside the engine failed for, if any: the web answers
    400 for it rather than 500: `response_format` (or `tools`), whose grammar the engine could not build (an
    invalid schema the web's check let through, a tokenizer llguidance cannot read, the compile's time bound;
    inference.engine.structured.StructuredGate, whose messages name the parameter). An engine output that
    carries its own `error_param` wins."""
    param = getattr(output, "error_param", None)
    if param is not None or output.finish_reason != "error":
        return param
    error = getattr(output, "error", None) or ""
    if job.sampling.get("structured_output") is None:
        return None
    return next((param for param in ("response_format", "tools") if param in error), None)


class Finisher:
    """The finisher thread of one worker (see the module docstring)."""

    backlog = 32  # hand-overs that may wait for the thread before the loop waits for it

    def __init__(self, *, queue: JobQueue, sink: EventSink, worker_id: str) -> None:
        self.queue = queue
        self.sink = sink
        self.worker_id = worker_id
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="finish")
        self._pending: deque[Future] = deque()  # its calls not yet done, oldest first
        self._to_finish: deque[tuple[ActiveRequest, Any, float]] = deque()  # handed over, not yet taken

    def submit(self, finished: list[tuple[ActiveRequest, Any]], now: float) -> None:
        """(The loop.) Hand over one step's finished requests (active, engine output), finished at `now`."""
        pending = self._pending
        while pending and pending[0].done():
            pending.popleft()
        if len(pending) >= self.backlog:  # the database is not keeping up
            pending.popleft().result()
        self._to_finish.extend((active, output, now) for active, output in finished)
        pending.append(self._pool.submit(self._take))

    def close(self, *, then: Any = None) -> None:
        """Finish everything handed over, run `then()` on the thread (its connections' clean-up), stop it."""
        if then is not None:
            self._pool.submit(then)
        self._pool.shutdown(wait=True)

    def _take(self) -> None:
        """(The thread.) Everything handed over that no earlier call took: one step's requests, or
        several steps' when the thread fell behind (it catches up in one insert)."""
        batch = []
        while self._to_finish:
            batch.append(self._to_finish.popleft())
        if batch:
            try:
                self._finish_all(batch)
            except Exception:  # noqa: BLE001 - never an exception left in the future the loop may wait on
                logger.exception("finishing %s failed", [active.job.request_id for active, _o, _n in batch])

    def _finish_all(self, finished: list[tuple[ActiveRequest, Any, float]]) -> None:
        """The usage records of `finished` in one insert, then their done events together, then their
        leases released in one call."""
        endings: list[Ending] = []
        dones: list[tuple[str, Done]] = []
        for active, output, now in finished:
            job = active.job
            try:
                ending, done = output_ending(active=active, output=output, now=now, worker_id=self.worker_id)
            except Exception as exc:  # noqa: BLE001
                logger.exception("finishing %s failed", job.request_id)
                ending, done = job_ending(job=job, worker_id=self.worker_id, finish_reason="error",
                                          error=f"Worker error: {exc}", seq=active.next_seq, **active.tokens_so_far())
            endings.append(ending)
            dones.append((job.reply_channel, done))
        endings_record(endings)
        try:
            self.sink.send_many(dones)
        except Exception:  # noqa: BLE001 - the leases are still released
            logger.exception("sending %d done events failed", len(dones))
        ids = [active.job.request_id for active, _output, _now in finished]
        for attempt in range(COMPLETE_ATTEMPTS):  # Redis restarting: its leases must not outlive the requests
            try:
                self.queue.complete_many(self.worker_id, ids)
                return
            except Exception as exc:  # noqa: BLE001 - their leases stay until this worker leaves or is reaped
                if not connection_lost(exc) or attempt == COMPLETE_ATTEMPTS - 1:
                    logger.warning("completing %s failed: %r", ids, exc)
                    return
                time.sleep(min(2.0, 0.1 * 2**attempt))
