"""The in-process admission backend (embedded mode): one lock, the same semantics as the Lua script."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from .base import (
    CONCURRENCY, TOKENS, Actual, AdmissionBackend, BucketState, CounterAfter, Decision, Plan, Refusal,
)


@dataclass(slots=True)
class _Reservation:
    deadline: float
    buckets: list[tuple[str, str, float, int]]  # key, kind, seconds per unit, units taken
    slots: list[str]
    counters: list[tuple[str, str, int, int, str]]  # key, kind, amount reserved, limit, next period's key
    hold_s: float = 0.0
    period_end: float = 0.0


def bucket_take(*, tat: float, now: float, limit: int, cost: int, window_s: float) -> tuple[float, float, int, int]:
    """GCRA: (new TAT, seconds to wait (0: fits), units used before, units remaining after).

    Shared with the tests' expectations; the Lua script restates it (redis_scripts.ADMIT).
    """
    interval = window_s / limit
    base = max(tat, now)
    new_tat = base + cost * interval
    used = math.ceil(round((base - now) / interval, 3))
    wait = new_tat - now - window_s
    remaining = math.floor(round((window_s - (new_tat - now)) / interval, 3))
    return new_tat, max(0.0, wait), used, max(0, remaining)


def _counters_after(after: dict[str, tuple[str, int, int]]) -> list[CounterAfter]:
    return [CounterAfter(key=key, kind=kind, value=value, limit=limit) for key, (kind, value, limit) in after.items()]


class MemoryAdmission(AdmissionBackend):
    in_process = True

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._tats: dict[str, float] = {}
        self._slots: dict[str, dict[str, float]] = {}  # key -> request id -> expiry
        self._counters: dict[str, tuple[int, float]] = {}  # key -> (value, expiry)
        self._open: dict[str, dict[str, int]] = {}  # counter key -> request id -> reserved
        self._reservations: dict[str, _Reservation] = {}
        self._leases: dict[str, float] = {}  # request id -> end of its pre-enqueue lease (until confirmed)
        self._alerts: dict[str, float] = {}

    async def aadmit(self, plan: Plan) -> Decision:
        return self.admit(plan)  # a lock and a few dict operations: no thread hop

    async def asettle(self, request_id: str, actual: Actual):
        return self.settle(request_id, actual)

    async def aextend(self, request_ids: list[str], seconds: float) -> int:
        return self.extend(request_ids, seconds)

    async def aconfirm(self, request_id: str) -> bool:
        return self.confirm(request_id)

    def _counter(self, key: str, now: float) -> int | None:
        entry = self._counters.get(key)
        if entry is None or entry[1] <= now:
            self._counters.pop(key, None)
            return None
        return entry[0]

    def admit(self, plan: Plan) -> Decision:
        with self._lock:
            now = self.clock()
            if plan.request_id in self._reservations:
                raise ValueError(f"request {plan.request_id!r} already holds a reservation")
            values = [self._counter(c.key, now) for c in plan.counters]
            missing = [c.key for c, value in zip(plan.counters, values) if value is None]
            if missing:
                return Decision(admitted=False, missing=missing)
            for counter, value in zip(plan.counters, values):
                if value + counter.amount > counter.limit:
                    return Decision(admitted=False, refusal=Refusal(
                        kind=counter.kind, key=counter.key, limit=counter.limit, used=value,
                        requested=counter.amount, retry_after_s=0.0))
            for slot in plan.slots:
                holders = self._slots.setdefault(slot.key, {})
                for rid in [rid for rid, expiry in holders.items() if expiry <= now]:
                    del holders[rid]
                if len(holders) >= slot.limit:
                    return Decision(admitted=False, refusal=Refusal(
                        kind=CONCURRENCY, key=slot.key, limit=slot.limit, used=len(holders), requested=1,
                        retry_after_s=1.0))
            taken = []
            for bucket in plan.buckets:
                new_tat, wait, used, remaining = bucket_take(
                    tat=self._tats.get(bucket.key, 0.0), now=now, limit=bucket.limit, cost=bucket.cost,
                    window_s=bucket.window_s)
                if wait > 0:
                    too_big = bucket.cost > bucket.limit
                    return Decision(admitted=False, refusal=Refusal(
                        kind=bucket.kind, key=bucket.key, limit=bucket.limit, used=used, requested=bucket.cost,
                        retry_after_s=0.0 if too_big else wait))
                taken.append((bucket, new_tat, remaining))
            # every check passed: take them all
            states = []
            for bucket, new_tat, remaining in taken:
                self._tats[bucket.key] = new_tat
                states.append(BucketState(key=bucket.key, kind=bucket.kind, limit=bucket.limit,
                                          remaining=remaining, reset_s=new_tat - now))
            if plan.count_only:
                return Decision(admitted=True, buckets=states)
            held_until = now + (plan.lease_s or plan.hold_s)
            for slot in plan.slots:
                self._slots[slot.key][plan.request_id] = held_until
            for counter in plan.counters:
                value, expiry = self._counters[counter.key]
                self._counters[counter.key] = (value + counter.amount, expiry)
                self._open.setdefault(counter.key, {})[plan.request_id] = counter.amount
            self._reservations[plan.request_id] = _Reservation(
                deadline=held_until,
                buckets=[(b.key, b.kind, b.window_s / b.limit, b.cost) for b in plan.buckets],
                slots=[s.key for s in plan.slots],
                counters=[(c.key, c.kind, c.amount, c.limit, c.next_key) for c in plan.counters],
                hold_s=plan.hold_s, period_end=plan.period_end,
            )
            if plan.lease_s:
                self._leases[plan.request_id] = held_until
            return Decision(admitted=True, buckets=states)

    def extend(self, request_ids: list[str], seconds: float) -> int:
        with self._lock:
            now, renewed = self.clock(), 0
            for rid in request_ids:
                reservation = self._reservations.get(rid)
                if reservation is None or rid not in self._leases or self._leases[rid] <= now:
                    continue  # gone, confirmed, or past its lease's end (its slots may be others' now)
                self._leases[rid] = reservation.deadline = now + seconds
                for key in reservation.slots:
                    if rid in self._slots.get(key, {}):
                        self._slots[key][rid] = now + seconds
                renewed += 1
            return renewed

    def confirm(self, request_id: str) -> bool:
        with self._lock:
            now = self.clock()
            reservation = self._reservations.get(request_id)
            if reservation is None:
                return False
            self._leases.pop(request_id, None)
            reservation.deadline = now + reservation.hold_s
            for key in reservation.slots:
                self._slots.setdefault(key, {})[request_id] = reservation.deadline
            return True

    def settle(self, request_id: str, actual: Actual) -> list[CounterAfter] | None:
        with self._lock:
            after: dict[str, tuple[str, int, int]] = {}
            if not self._settle(request_id, actual, self.clock(), after):
                return None
            return _counters_after(after)

    def settle_many(self, items: list[tuple[str, Actual]]) -> list[CounterAfter]:
        """As the base class's, under one lock and one clock reading (the worker's step: one call)."""
        with self._lock:
            now, after = self.clock(), {}
            for request_id, actual in items:
                self._settle(request_id, actual, now, after)
            return _counters_after(after)

    def _settle(self, request_id: str, actual: Actual, now: float, after: dict[str, tuple[str, int, int]]) -> bool:
        """(Under the lock.) Consume one reservation; each counter it had reserved on goes into `after`
        (key -> kind, value after, limit)."""
        reservation = self._reservations.pop(request_id, None)
        if reservation is None:
            return False
        self._leases.pop(request_id, None)
        for key, kind, interval, taken in reservation.buckets:
            refund = taken - actual.tokens if kind == TOKENS else 0
            if refund > 0 and key in self._tats:
                self._tats[key] = max(now, self._tats[key] - refund * interval)
        for key in reservation.slots:
            self._slots.get(key, {}).pop(request_id, None)
        crossed = bool(reservation.period_end and actual.at and actual.at >= reservation.period_end)
        for key, kind, amount, limit, next_key in reservation.counters:
            self._open.get(key, {}).pop(request_id, None)
            value = self._counter(key, now)
            if value is not None:  # a counter seeded after the reservation already left it out
                value += (0 if crossed else actual.of(kind)) - amount
                self._counters[key] = (value, self._counters[key][1])
                after[key] = (kind, value, limit)
            following = self._counter(next_key, now) if crossed and next_key else None
            if following is not None:  # missing: its rebuild reads the record from the ledger
                following += actual.of(kind)
                self._counters[next_key] = (following, self._counters[next_key][1])
                after[next_key] = (kind, following, limit)
        return True

    def open_reserved(self, key: str) -> int:
        with self._lock:
            return sum(self._open.get(key, {}).values())

    def counter_seed(self, key: str, value: int, ttl_s: int) -> bool:
        with self._lock:
            now = self.clock()
            if self._counter(key, now) is not None:
                return False
            self._counters[key] = (int(value), now + ttl_s)
            return True

    def counter_get(self, key: str) -> int | None:
        with self._lock:
            return self._counter(key, self.clock())

    def stale_reservations(self) -> list[str]:
        with self._lock:
            now = self.clock()
            return [rid for rid, reservation in self._reservations.items() if reservation.deadline <= now]

    def held(self) -> tuple[int, int]:
        with self._lock:
            return len(self._reservations), sum(len(holders) for holders in self._slots.values())

    def alert_mark(self, key: str, ttl_s: int) -> bool:
        with self._lock:
            now = self.clock()
            if self._alerts.get(key, 0.0) > now:
                return False
            self._alerts[key] = now + ttl_s
            return True

    def flush(self) -> None:
        with self._lock:
            for store in (self._tats, self._slots, self._counters, self._open, self._reservations, self._leases,
                          self._alerts):
                store.clear()
