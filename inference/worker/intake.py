"""What a worker says at each intake (WorkerLoop._intake): the jobs it could take, and how often it comes.

- Room: a worker holds at most max_num_seqs + prefetch jobs and leases nothing while `prefetch` or more
  wait inside the engine (KV cache full); the rest stay on the shared queue for other workers.
- Intake interval: the moving average of the time between two intakes with an engine step between them
  (one busy pass: the step and its hand-overs). The queue's prefix-aware routing uses it to tell a busy
  preferred worker that will be back in time from one stuck in a long step (inference.queue.routing).
"""

from __future__ import annotations

import time
from typing import Any

INTAKE_EWMA_WEIGHT = 0.2  # of the newest pass


def intake_room(engine: Any, active: int, max_num_seqs: int, prefetch: int) -> int:
    """The jobs a worker holding `active` may lease now."""
    try:
        waiting = int(engine.stats().get("waiting", 0))
    except Exception:  # noqa: BLE001
        waiting = 0
    if waiting >= max(1, prefetch):
        return 0
    return max(0, max_num_seqs + prefetch - active)


class IntakeClock:
    """The seconds between a busy worker's intakes, averaged (0.0 until one busy pass was timed)."""

    def __init__(self) -> None:
        self.every_s = 0.0
        self._at = 0.0
        self._stepped_from: float | None = None  # the intake the last pass's step followed

    def intake(self) -> float:
        """An intake now: the interval to report with it."""
        now = time.monotonic()
        if self._stepped_from is not None:
            gap = now - self._stepped_from
            self.every_s = gap if self.every_s <= 0 else (1 - INTAKE_EWMA_WEIGHT) * self.every_s + INTAKE_EWMA_WEIGHT * gap
        self._at, self._stepped_from = now, None
        return self.every_s

    def stepped(self) -> None:
        """The pass that began at the last intake ran an engine step."""
        self._stepped_from = self._at
