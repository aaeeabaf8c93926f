"""The admission contract, shared by the in-process and the Redis backend.

A request is admitted against a `Plan`: every limit that applies to it,
checked and taken in one atomic step (all or nothing), so a request refused
by its budget has consumed none of its rate limits.

- `Bucket`: a rate limit (requests or tokens per minute) as GCRA, i.e. a
  token bucket of `limit` units refilling continuously over `window_s`,
  kept as one number, the theoretical arrival time (TAT). Taking `cost`
  units moves the TAT by `cost * window_s / limit`; the take fits while the
  TAT stays within `window_s` of now. A refund moves it back.
- `Slot`: a concurrency limit; the request holds one slot until it settles
  (or until `hold_s` passes, the longest a request can live).
- `Counter`: a period's quota or budget (tokens, nano-dollars) holding the
  settled usage of the period plus the open reservations. A counter that is
  missing (new period, Redis flushed or restarted) refuses nothing and
  admits nothing: the admission answers `missing` and the caller seeds it
  from the ledger (`counter_seed`), then asks again.

`admit` reserves; `settle` consumes the reservation exactly once, giving back
what the request did not use (unused output and cached prompt tokens for
token buckets, the difference between the worst case and the actual amount
for counters) and freeing its slots. Settling an unknown or already settled
reservation changes nothing.

Backends keep time on one clock: Redis's `TIME` inside the script (every web
process agrees), or the injected `clock` of the in-process backend.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

# Kinds of what a request takes: buckets count requests or tokens, counters tokens or spend.
REQUESTS = "requests"
TOKENS = "tokens"
QUOTA = "quota"  # a period's tokens (prompt + completion)
SPEND = "spend"  # a period's cost, nano-dollars
_ACTUAL_KINDS = frozenset((TOKENS, QUOTA, SPEND))


class AdmissionUnavailable(Exception):
    """The counters cannot be reached (Redis down): nothing may be admitted."""


@dataclass(frozen=True, slots=True)
class Bucket:
    key: str
    kind: str  # REQUESTS or TOKENS
    limit: int
    cost: int
    window_s: float = 60.0


@dataclass(frozen=True, slots=True)
class Slot:
    key: str
    limit: int


@dataclass(frozen=True, slots=True)
class Counter:
    key: str
    kind: str  # QUOTA or SPEND
    limit: int
    amount: int  # the worst case, reserved at admission
    ttl_s: int  # the counter outlives its period by a margin, then goes


@dataclass(frozen=True, slots=True)
class Plan:
    request_id: str
    buckets: tuple[Bucket, ...] = ()
    slots: tuple[Slot, ...] = ()
    counters: tuple[Counter, ...] = ()
    hold_s: float = 900.0  # the longest a request can live: a slot or reservation older than this is stale

    @property
    def empty(self) -> bool:
        return not (self.buckets or self.slots or self.counters)


@dataclass(frozen=True, slots=True)
class BucketState:
    """A bucket after the admission: what the `x-ratelimit-*` headers say."""

    key: str
    kind: str
    limit: int
    remaining: int
    reset_s: float  # until the bucket is full again


@dataclass(frozen=True, slots=True)
class Refusal:
    """Which limit refused, and its numbers for the error message."""

    kind: str  # REQUESTS, TOKENS, "concurrency", QUOTA or SPEND
    key: str
    limit: int
    used: int
    requested: int
    retry_after_s: float  # 0 when waiting cannot help (more than the whole limit)


@dataclass(slots=True)
class Decision:
    admitted: bool
    buckets: list[BucketState] = field(default_factory=list)
    refusal: Refusal | None = None
    missing: list[str] = field(default_factory=list)  # counters to seed before asking again


@dataclass(frozen=True, slots=True)
class Actual:
    """What a finished request really used, per kind of its reservation."""

    tokens: int = 0  # counted against tokens per minute: uncached prompt + completion
    quota: int = 0  # prompt + completion tokens
    spend: int = 0  # nano-dollars

    def of(self, kind: str) -> int:
        return getattr(self, kind) if kind in _ACTUAL_KINDS else 0  # (the kinds are its fields' names)


@dataclass(frozen=True, slots=True)
class CounterAfter:
    """A counter after a settlement: its value and limit (the budget alerts read these)."""

    key: str
    kind: str
    value: int
    limit: int


class AdmissionBackend(abc.ABC):
    prefix = ""  # keys of this backend start with it (Redis: a hash tag, one cluster slot)

    def key(self, *parts: object) -> str:
        return ":".join((self.prefix, *map(str, parts))) if self.prefix else ":".join(map(str, parts))

    @abc.abstractmethod
    def admit(self, plan: Plan) -> Decision:
        """Check every limit of `plan` and take them all, or take nothing."""

    async def aadmit(self, plan: Plan) -> Decision:
        return await asyncio.to_thread(self.admit, plan)

    @abc.abstractmethod
    def settle(self, request_id: str, actual: Actual) -> list[CounterAfter] | None:
        """Consume the reservation once; None when there was none (unknown or already settled)."""

    def settle_many(self, items: list[tuple[str, Actual]]) -> list[CounterAfter]:
        """Settle each of `items` (a worker's step) as `settle` does; each counter they had reserved
        on comes back once, with its value after all of them (what the budget alerts read)."""
        after: dict[str, CounterAfter] = {}
        for request_id, actual in items:
            after.update((counter.key, counter) for counter in self.settle(request_id, actual) or ())
        return list(after.values())

    def settle_many_start(self, items: list[tuple[str, Actual]]) -> Callable[[], list[CounterAfter]]:
        """Start `settle_many(items)`; the returned function finishes it and returns its result. A backend
        behind a round trip sends the call now and reads the reply then (Redis), so that the caller's own
        work in between (the worker's usage-record insert) overlaps it; this one settles at once."""
        after = self.settle_many(items)
        return lambda: after

    async def asettle(self, request_id: str, actual: Actual) -> list[CounterAfter] | None:
        return await asyncio.to_thread(self.settle, request_id, actual)

    @abc.abstractmethod
    def open_reserved(self, key: str) -> int:
        """The sum of the open reservations on counter `key` (what a rebuild adds to the ledger)."""

    @abc.abstractmethod
    def counter_seed(self, key: str, value: int, ttl_s: int) -> bool:
        """Create counter `key` at `value` unless it exists (another process seeded it first)."""

    @abc.abstractmethod
    def counter_get(self, key: str) -> int | None: ...

    @abc.abstractmethod
    def stale_reservations(self) -> list[str]:
        """Request ids whose reservation is older than its plan's `hold_s`."""

    @abc.abstractmethod
    def held(self) -> tuple[int, int]:
        """(open reservations, concurrency slots held): both 0 once every admitted request has ended
        (the metrics' leak check)."""

    def alert_mark(self, key: str, ttl_s: int) -> bool:
        """True the first time `key` is marked (an alert goes out once per threshold and period)."""
        raise NotImplementedError

    @abc.abstractmethod
    def flush(self) -> None:
        """Forget everything (tests)."""
