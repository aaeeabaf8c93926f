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
        if seq.num_preemptions >= self.max_preemptions > 0:
            return -math.inf
        if self.aging_s is None:
            return seq.priority
        return seq.priority - max(0.0, now - seq.arrival_time) // self.aging_s

    def sort_key(self, now: float):
        eff = self.effective_priority

        def key(seq: Sequence):
            return (eff(seq, now), seq.arrival_time, seq.order)

        return key

    def outranks(self, candidate: Sequence, victim: Sequence, now: float) -> bool:
        """May `candidate` (waiting) preempt `victim` (running)? Only for a strictly better priority."""
        return self.effective_priority(candidate, now) < self.effective_priority(victim, now)
