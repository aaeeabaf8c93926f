"""Ordering policy for the scheduler: who goes first, who is preempted.

Requests are ordered by effective priority (lower first), then arrival, then
insertion order. Two guards keep anyone from starving:
- aging: a request gains one priority level per `aging_s` seconds since it
  arrived, so a flood of high-priority work cannot hold it back forever;
- a preemption bound: once preempted `max_preemptions` times a request ranks
  ahead of every unprotected one, so it is no longer chosen as a victim while
  any other candidate exists (among protected requests the latest goes first,
  so the earliest always progresses).
"""

from __future__ import annotations

import math

from inference.engine.sequence import Sequence


class PriorityPolicy:
    __slots__ = ("aging_s", "max_preemptions")

    def __init__(self, *, aging_s: float | None, max_preemptions: int) -> None:
        self.aging_s = aging_s
        self.max_preemptions = max_preemptions

    def effective_priority(self, seq: Sequence, now: float) -> float:
        return self.sort_key(now)(seq)[0]

    def sort_key(self, now: float):
        """(effective priority, arrival, insertion order) of a sequence at `now`. One closure call per
        sequence (the scheduler sorts every running sequence every step), so it is written inline."""
        aging, bound = self.aging_s, self.max_preemptions

        def key(seq: Sequence):
            if seq.num_preemptions >= bound > 0:
                return (-math.inf, seq.arrival_time, seq.order)
            if aging is None:
                return (seq.priority, seq.arrival_time, seq.order)
            arrival = seq.arrival_time
            return (seq.priority - (now - arrival if now > arrival else 0.0) // aging, arrival, seq.order)

        return key

    def outranks(self, candidate: Sequence, victim: Sequence, now: float) -> bool:
        """May `candidate` (waiting) preempt `victim` (running)? Only for a strictly better priority."""
        return self.effective_priority(candidate, now) < self.effective_priority(victim, now)
