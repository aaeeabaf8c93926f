"""How the worker loop ends one request it holds: abort it in the engine, fail it (an error event and its
usage record), finish a request the engine lost, release its lease. A mixin of `WorkerLoop`
(inference.worker.loop), which provides `engine`, `queue`, `sink`, `worker_id` and `active`."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from .finish import job_fail, job_finish

if TYPE_CHECKING:
    from inference.queue import JobQueue

    from .events import EventSink
    from .finish import ActiveRequest
    from .serving_engine import ServingEngine

logger = logging.getLogger(__name__)


class RequestEndings:
    engine: ServingEngine
    queue: JobQueue
    sink: EventSink
    worker_id: str
    active: dict[str, ActiveRequest]

    def _engine_abort(self, request_id: str) -> None:
        try:
            self.engine.abort(request_id)
        except Exception:  # noqa: BLE001 - it may never have been added
            logger.debug("abort of %s failed", request_id, exc_info=True)

    def _fail(self, request_id: str, error: str, *, mark: bool = False, error_param: str | None = None) -> None:
        active = self.active.get(request_id)
        if active is None:
            return
        if mark or not active.started:
            if request_id not in self.queue.mark_started(self.worker_id, [request_id]):
                self.active.pop(request_id, None)
                return
        job_fail(job=active.job, sink=self.sink, worker_id=self.worker_id, error=error, error_param=error_param,
                 seq=active.next_seq, **active.tokens_so_far())
        self._release(request_id)

    def _end_lost(self, request_id: str) -> None:
        active = self.active.get(request_id)
        if active is None:
            return
        if not active.aborting:
            self._fail(request_id, "The engine lost this request.")
            return
        if not active.started and request_id not in self.queue.mark_started(self.worker_id, [request_id]):
            self.active.pop(request_id, None)
            return
        job_finish(job=active.job, sink=self.sink, worker_id=self.worker_id, finish_reason="abort",
                   ttft_s=active.ttft_s, seq=active.next_seq, **active.tokens_so_far())
        self._release(request_id)

    def _release(self, request_id: str) -> None:
        self.active.pop(request_id, None)
        try:
            self.queue.complete(self.worker_id, request_id)
        except Exception:  # noqa: BLE001
            logger.exception("completing %s failed", request_id)
