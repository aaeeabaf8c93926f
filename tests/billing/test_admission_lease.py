"""The pre-enqueue lease, settling into the next period, and count-only plans: both backends (no sleeps).

- A reservation made with a lease holds its slot only for `lease_s` unless its
  web process renews it (`extend`) or its job is queued (`confirm`, then
  `hold_s`): a web process killed between admission and the queue frees its
  concurrency slot within the lease, and the stale sweep finds the rest.
  Before the lease, such a slot was held for `hold_s` (900 s).
- A request admitted before its period's end whose record is dated after it
  leaves the old period's counters whole and counts in the next period's.
- A count-only plan takes its buckets and holds nothing.
"""

from __future__ import annotations

import uuid

from billing.counters.base import QUOTA, REQUESTS, SPEND, Actual, Bucket, Counter, Plan, Slot
from billing.counters.keys import CounterKey
from tenants.services.limits import LimitScope
from tests.billing.admission_helpers import backend_and_clock  # noqa: F401

T1, T2 = LimitScope.tenant(1), LimitScope.tenant(2)

HOLD_S, LEASE_S = 900.0, 5.0


def rid() -> str:
    return uuid.uuid4().hex


def _slot(backend) -> Slot:
    return Slot(backend.key(CounterKey.concurrency(T1)), 1)


def _leased(backend, request_id: str) -> Plan:
    return Plan(request_id=request_id, slots=(_slot(backend),), hold_s=HOLD_S, lease_s=LEASE_S)


def test_an_unrenewed_lease_frees_the_slot_within_the_lease(backend_and_clock):
    backend, advance = backend_and_clock
    lost = rid()
    assert backend.admit(_leased(backend, lost)).admitted
    assert backend.admit(_leased(backend, rid())).refusal.kind == "concurrency"
    assert backend.stale_reservations() == []
    advance(LEASE_S + 0.5)  # its web process died: nothing renewed it
    assert backend.admit(_leased(backend, rid())).admitted  # the slot is free, not held for HOLD_S
    assert lost in backend.stale_reservations()  # and the sweep settles (or releases) the rest of it


def test_a_renewed_lease_keeps_the_slot_and_a_confirmed_one_holds_it(backend_and_clock):
    backend, advance = backend_and_clock
    request = rid()
    assert backend.admit(_leased(backend, request)).admitted
    for _ in range(4):  # 16 s in the web's hands, renewed every 4 s
        advance(LEASE_S - 1)
        assert backend.extend([request], LEASE_S) == 1
    assert backend.admit(_leased(backend, rid())).refusal.kind == "concurrency"
    assert backend.confirm(request)  # on the queue: held up to HOLD_S from now, no renewal needed
    assert backend.extend([request], LEASE_S) == 0  # confirmed: no longer on a lease
    advance(HOLD_S - 10)
    assert backend.admit(_leased(backend, rid())).refusal.kind == "concurrency"
    assert backend.stale_reservations() == []
    advance(11)
    assert request in backend.stale_reservations()
    assert backend.settle(request, Actual()) is not None


def test_a_lease_past_its_end_is_not_renewed_and_settling_ends_it(backend_and_clock):
    backend, advance = backend_and_clock
    late, settled = rid(), rid()
    assert backend.admit(_leased(backend, late)).admitted
    advance(LEASE_S + 0.5)
    assert backend.extend([late], LEASE_S) == 0  # its slot may be another request's by now
    slot = Slot(backend.key(CounterKey.concurrency(T2)), 1)
    assert backend.admit(Plan(request_id=settled, slots=(slot,), hold_s=HOLD_S, lease_s=LEASE_S)).admitted
    assert backend.settle(settled, Actual()) == []
    assert backend.extend([settled], LEASE_S) == 0
    assert not backend.confirm(settled)


def _counters(backend, *, limit: int, amount: int) -> tuple[Counter, Counter]:
    def make(kind: str) -> Counter:
        return Counter(backend.key(CounterKey.period_total(T1, "2026-01", kind)), kind, limit, amount, 3600,
                       next_key=backend.key(CounterKey.period_total(T1, "2026-02", kind)))

    return make(QUOTA), make(SPEND)


def test_a_request_ending_after_the_periods_end_counts_in_the_next_period(backend_and_clock):
    backend, _ = backend_and_clock
    period_end = 1_800_000_000.0
    quota, spend = _counters(backend, limit=10**9, amount=1_000)
    for key in (quota.key, quota.next_key, spend.key, spend.next_key):
        assert backend.counter_seed(key, 100, 3600)
    crossing, inside = rid(), rid()
    for request in (crossing, inside):
        assert backend.admit(Plan(request_id=request, counters=(quota, spend), period_end=period_end)).admitted
    assert backend.counter_get(quota.key) == 2_100
    after = backend.settle_many([(crossing, Actual(quota=300, spend=70, at=period_end + 0.1)),
                                 (inside, Actual(quota=40, spend=9, at=period_end - 0.1))])
    assert backend.counter_get(quota.key) == 140 and backend.counter_get(spend.key) == 109  # crossing: given back
    assert backend.counter_get(quota.next_key) == 400 and backend.counter_get(spend.next_key) == 170
    assert {(a.key, a.value) for a in after} >= {(quota.next_key, 400), (spend.next_key, 170), (quota.key, 140)}
    assert backend.open_reserved(quota.key) == 0


def test_a_crossing_request_whose_next_counter_is_missing_leaves_it_to_the_rebuild(backend_and_clock):
    backend, _ = backend_and_clock
    period_end = 1_800_000_000.0
    quota, _spend = _counters(backend, limit=10**9, amount=1_000)
    assert backend.counter_seed(quota.key, 0, 3600)
    request = rid()
    assert backend.admit(Plan(request_id=request, counters=(quota,), period_end=period_end)).admitted
    backend.settle(request, Actual(quota=300, at=period_end + 5))
    assert backend.counter_get(quota.key) == 0
    assert backend.counter_get(quota.next_key) is None  # seeded later from the ledger, where its record is


def test_a_count_only_plan_takes_its_buckets_and_holds_nothing(backend_and_clock):
    backend, _ = backend_and_clock
    bucket = Bucket(backend.key(CounterKey.rate(LimitScope.key(9), REQUESTS)), REQUESTS, 3, 1)
    for _ in range(3):
        decision = backend.admit(Plan(request_id=rid(), buckets=(bucket,), count_only=True))
        assert decision.admitted
    assert decision.buckets[0].remaining == 0
    assert backend.held() == (0, 0)
    assert backend.stale_reservations() == []
    assert not backend.admit(Plan(request_id=rid(), buckets=(bucket,), count_only=True)).admitted
