"""How the worker loop ends one request it holds outside the engine's own finishes: fail it (an error event
and its usage record), finish a request the engine lost, release its lease. `RequestEndings` is held by
`WorkerLoop` (inference.worker.loop) and given what it needs: the queue, the event sink, the worker's id
and the loop's table of requests in hand (shared: an ended request leaves it)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from .finish import job_fail, job_finish

if TYPE_CHECKING:
    from inference.queue import JobQueue

    from .events import EventSink
    from .finish import ActiveRequest

logger = logging.getLogger(__name__)


class RequestEndings:
    def __init__(self, *, queue: JobQueue, sink: EventSink, worker_id: str,
                 active: dict[str, ActiveRequest]) -> None:
        self.queue = queue
        self.sink = sink
        self.worker_id = worker_id
        self.active = active  # the loop's own dict

    def fail(self, request_id: str, error: str, *, mark: bool = False, error_param: str | None = None) -> None:
        """End a request in hand with an error (its record, then its error event), unless it is no longer
        ours (flagged started elsewhere: reaped)."""
        active = self.active.get(request_id)
        if active is None:
            return
        if mark or not active.started:
            if request_id not in self.queue.mark_started(self.worker_id, [request_id]):
                self.active.pop(request_id, None)
                return
        job_fail(job=active.job, sink=self.sink, worker_id=self.worker_id, error=error, error_param=error_param,
                 seq=active.next_seq, **active.tokens_so_far())
        self.release(request_id)

    def end_lost(self, request_id: str) -> None:
        """End a request the engine no longer holds: "abort" when it was being aborted, else an error."""
        active = self.active.get(request_id)
        if active is None:
            return
        if not active.aborting:
            self.fail(request_id, "The engine lost this request.")
            return
        if not active.started and request_id not in self.queue.mark_started(self.worker_id, [request_id]):
            self.active.pop(request_id, None)
            return
        job_finish(job=active.job, sink=self.sink, worker_id=self.worker_id, finish_reason="abort",
                   ttft_s=active.ttft_s, seq=active.next_seq, **active.tokens_so_far())
        self.release(request_id)

    def release(self, request_id: str) -> None:
        self.active.pop(request_id, None)
        try:
            self.queue.complete(self.worker_id, request_id)
        except Exception:  # noqa: BLE001
            logger.exception("completing %s failed", request_id)
