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
- `Counter`: a period's quota or budget (tokens, nano-dollars: billing.counters.units) holding the
  settled usage of the period plus the open reservations. A counter that is
  missing (new period, Redis flushed or restarted) refuses nothing and
  admits nothing: the admission answers `missing` and the caller seeds it
  from the ledger (`counter_seed`), then asks again.

`admit` reserves; `settle` consumes the reservation exactly once, giving back
what the request did not use (unused output and cached prompt tokens for
token buckets, the difference between the worst case and the actual amount
for counters) and freeing its slots. Settling an unknown or already settled
reservation changes nothing.

The pre-enqueue lease (`Plan.lease_s`): a reservation starts out held only for
`lease_s` seconds, which the web process that made it renews (`extend`) while
the request is in its hands, until the job is on the queue (`confirm`): from
then on it is held up to `hold_s`, and the worker (or the reaper) settles it,
as before. A web process that dies in between stops renewing: its slots are
free once the lease has run out (their expiry is the lease's end), and its
reservation is stale then (`stale_reservations`), so the periodic sweep gives
back its quota and budget (or settles them to a usage record, if the job did
run). A slot is no longer held for `hold_s` by a request that never reached a
worker.

A reservation whose request ends in the next period (`Actual.at` at or after
`Plan.period_end`: admitted at 23:59:59.9, finished after midnight) leaves its
admission period's counters and is counted in the next period's
(`Counter.next_key`), the period its usage record's `created_at` is in: the
counters and the invoices put each request in the same month
(billing.periods).

A count-only plan (`Plan.count_only`) takes its buckets and holds nothing:
what a refused request costs (an oversize or malformed body counts one
request against the key's requests per minute).

Keys are opaque strings to the backends; the policy builds them from typed parts
(`AdmissionBackend.key(CounterKey)`, billing.counters.keys).

Backends keep time on one clock: Redis's `TIME` inside the script (every web
process agrees), or the injected `clock` of the in-process backend.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

# Kinds of what a request takes (named, with their units and keys, in billing.counters.keys)
from .keys import CONCURRENCY, QUOTA, REQUESTS, SPEND, TOKENS, CounterKey  # noqa: F401 - re-exported

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
    next_key: str = ""  # the same counter of the next period: a request that ends there is counted there


@dataclass(frozen=True, slots=True)
class Plan:
    request_id: str
    buckets: tuple[Bucket, ...] = ()
    slots: tuple[Slot, ...] = ()
    counters: tuple[Counter, ...] = ()
    hold_s: float = 900.0  # the longest a request can live: a slot or reservation older than this is stale
    lease_s: float = 0.0  # > 0: held this long unless renewed (extend) until the job is queued (confirm)
    period_end: float = 0.0  # unix seconds: the counters' period ends here (0: always settle in place)
    count_only: bool = False  # take the buckets, reserve nothing (no slots, no counters allowed)

    def __post_init__(self) -> None:
        if self.count_only and (self.slots or self.counters):
            raise ValueError("a count-only plan takes buckets only")

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

    kind: str  # REQUESTS, TOKENS, CONCURRENCY, QUOTA or SPEND
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
    at: float = 0.0  # unix seconds its usage record is dated (created_at); 0: the admission's period

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
    in_process = False  # its calls are a lock and a few dict operations: no round trip to wait for

    def key(self, counter: CounterKey) -> str:
        """The key of `counter` in this backend (under its prefix)."""
        return counter.render(self.prefix)

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
    def extend(self, request_ids: list[str], seconds: float) -> int:
        """Renew the pre-enqueue lease of these reservations for `seconds` more (their slots too); how many
        still held one (a reservation already released, settled or confirmed is left alone)."""

    @abc.abstractmethod
    def confirm(self, request_id: str) -> bool:
        """The request's job is queued: end its lease, hold it (and its slots) up to its plan's `hold_s` from
        now. False when the reservation is gone (its lease ran out first, or it was settled)."""

    async def aextend(self, request_ids: list[str], seconds: float) -> int:
        return await asyncio.to_thread(self.extend, request_ids, seconds)

    async def aconfirm(self, request_id: str) -> bool:
        return await asyncio.to_thread(self.confirm, request_id)

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
        """Request ids whose reservation is older than its plan's `hold_s`, or whose pre-enqueue lease ran out."""

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
