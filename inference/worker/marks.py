"""Flagging a step's new leases "started" while the step computes.

A lease flagged started may have sent events to its client, so a reaper fails
its job instead of requeueing it; the flag must be set before the first token
goes out. On Redis that is a round trip; sent from the engine's
`on_first_tokens` callback (before the model runs) on a thread of its own, it
is answered by the time the step ends, and is off every first token. The
in-process queue needs no thread: the loop marks after the step.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from inference.queue import JobQueue

logger = logging.getLogger(__name__)


class StartMarks:
    def __init__(self, *, queue: JobQueue, worker_id: str) -> None:
        self.queue = queue
        self.worker_id = worker_id
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="mark-started") if queue.remote else None
        self._sent: list[tuple[list[str], Future]] = []

    def callback(self, active: dict[str, Any]) -> Callable[[list[str]], None] | None:
        """The engine's `on_first_tokens` for one step (None: mark after the step): it flags the
        leases of `active` not yet started."""
        if self._pool is None:
            return None

        def mark_ahead(request_ids: list[str]) -> None:
            ids = [rid for rid in request_ids if rid in active and not active[rid].started]
            if ids:
                self._sent.append((ids, self._pool.submit(self.queue.mark_started, self.worker_id, ids)))

        return mark_ahead

    def answers(self) -> Iterator[tuple[str, bool]]:
        """(request id, still ours) for each mark sent during the step (answered by now: a step
        outlasts a round trip). Failed marks yield nothing: the loop marks those after the step."""
        sent, self._sent = self._sent, []
        for ids, future in sent:
            try:
                owned = future.result()
            except Exception:  # noqa: BLE001
                logger.warning("marking %d requests started during the step failed", len(ids), exc_info=True)
                continue
            for request_id in ids:
                yield request_id, request_id in owned

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
