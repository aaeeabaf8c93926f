"""Admission semantics, the same suite on the in-process and the Redis backend (no sleeps)."""

from __future__ import annotations

import threading
import uuid

import pytest

from billing.counters.base import QUOTA, REQUESTS, SPEND, TOKENS, Actual, Bucket, Counter, Plan, Slot
from billing.counters.keys import CounterKey, alert_mark_key
from tenants.services.limits import LimitScope
from tests.billing.admission_helpers import backend_and_clock  # noqa: F401

T1 = LimitScope.tenant(1)


def rid() -> str:
    return uuid.uuid4().hex


def rpm(backend, limit: int, scope: LimitScope = T1) -> Bucket:
    return Bucket(key=backend.key(CounterKey.rate(scope, REQUESTS)), kind=REQUESTS, limit=limit, cost=1)


def tpm(backend, limit: int, cost: int, scope: LimitScope = T1) -> Bucket:
    return Bucket(key=backend.key(CounterKey.rate(scope, TOKENS)), kind=TOKENS, limit=limit, cost=cost)


def counter(backend, kind: str, limit: int, amount: int) -> Counter:
    return Counter(key=backend.key(CounterKey.period_total(T1, "2026-11", kind)), kind=kind, limit=limit, amount=amount,
                   ttl_s=3600)


def test_requests_per_minute_admits_the_limit_then_refuses_until_refilled(backend_and_clock):
    backend, advance = backend_and_clock
    decisions = [backend.admit(Plan(request_id=rid(), buckets=(rpm(backend, 3),))) for _ in range(4)]
    assert [d.admitted for d in decisions] == [True, True, True, False]
    assert [d.buckets[0].remaining for d in decisions[:3]] == [2, 1, 0]
    assert decisions[2].buckets[0].reset_s == pytest.approx(60.0, abs=0.05)  # full again in a minute
    refusal = decisions[3].refusal
    assert (refusal.kind, refusal.limit, refusal.used, refusal.requested) == (REQUESTS, 3, 3, 1)
    assert refusal.retry_after_s == pytest.approx(20.0, abs=0.05)  # one request refills every 20 s
    advance(19.9)
    assert not backend.admit(Plan(request_id=rid(), buckets=(rpm(backend, 3),))).admitted
    advance(0.2)
    admitted = backend.admit(Plan(request_id=rid(), buckets=(rpm(backend, 3),)))
    assert admitted.admitted and admitted.buckets[0].remaining == 0


def test_tokens_refill_continuously_and_a_request_larger_than_the_limit_never_fits(backend_and_clock):
    backend, advance = backend_and_clock
    assert backend.admit(Plan(request_id=rid(), buckets=(tpm(backend, 600, 500),))).admitted
    refused = backend.admit(Plan(request_id=rid(), buckets=(tpm(backend, 600, 200),)))
    assert refused.refusal.used == 500 and refused.refusal.retry_after_s == pytest.approx(10.0, abs=0.05)
    advance(10.0)
    assert backend.admit(Plan(request_id=rid(), buckets=(tpm(backend, 600, 200),))).admitted
    too_big = backend.admit(Plan(request_id=rid(), buckets=(tpm(backend, 600, 601),))).refusal
    assert too_big.kind == TOKENS and too_big.retry_after_s == 0.0


def test_all_or_nothing_a_refusal_takes_no_other_limit(backend_and_clock):
    backend, _ = backend_and_clock
    budget = counter(backend, SPEND, limit=100, amount=60)
    assert backend.counter_seed(budget.key, 0, 3600)
    slot = Slot(backend.key(CounterKey.concurrency(T1)), 5)
    plan = lambda: Plan(request_id=rid(), buckets=(rpm(backend, 10),), slots=(slot,), counters=(budget,))
    assert backend.admit(plan()).admitted
    refused = backend.admit(plan())
    assert refused.refusal.kind == SPEND and (refused.refusal.used, refused.refusal.requested) == (60, 60)
    # the refused request consumed no request of the minute and no slot
    state = backend.admit(Plan(request_id=rid(), buckets=(rpm(backend, 10),))).buckets[0]
    assert state.remaining == 8
    assert backend.counter_get(budget.key) == 60


def test_concurrency_slots_are_held_until_settled_or_stale(backend_and_clock):
    backend, advance = backend_and_clock
    slot = Slot(backend.key(CounterKey.concurrency(T1)), 2)
    first, second = rid(), rid()
    assert backend.admit(Plan(request_id=first, slots=(slot,), hold_s=100)).admitted
    assert backend.admit(Plan(request_id=second, slots=(slot,), hold_s=100)).admitted
    refusal = backend.admit(Plan(request_id=rid(), slots=(slot,), hold_s=100)).refusal
    assert (refusal.kind, refusal.limit, refusal.used) == ("concurrency", 2, 2)
    assert backend.settle(first, Actual()) == []
    assert backend.settle(first, Actual()) is None  # exactly once
    assert backend.admit(Plan(request_id=rid(), slots=(slot,), hold_s=100)).admitted
    assert backend.stale_reservations() == []
    advance(100.5)  # a slot older than the longest request is freed, its reservation is stale
    assert second in backend.stale_reservations()
    assert backend.admit(Plan(request_id=rid(), slots=(slot,), hold_s=100)).admitted


def test_settlement_refunds_unused_tokens_and_corrects_counters(backend_and_clock):
    backend, _ = backend_and_clock
    quota = counter(backend, QUOTA, limit=10_000, amount=1_000)
    spend = counter(backend, SPEND, limit=5_000, amount=900)
    for c in (quota, spend):
        backend.counter_seed(c.key, 100, 3600)
    request = rid()
    decision = backend.admit(Plan(request_id=request, buckets=(tpm(backend, 6_000, 1_000),), counters=(quota, spend)))
    assert decision.buckets[0].remaining == 5_000
    assert backend.open_reserved(quota.key) == 1_000
    after = backend.settle(request, Actual(tokens=250, quota=400, spend=300))
    assert {(a.kind, a.value, a.limit) for a in after} == {(QUOTA, 500, 10_000), (SPEND, 400, 5_000)}
    assert backend.open_reserved(quota.key) == 0
    # 750 tokens came back: the next request sees 5,750 left (less the 1 it takes)
    state = backend.admit(Plan(request_id=rid(), buckets=(tpm(backend, 6_000, 1),))).buckets[0]
    assert state.remaining == 5_749


def test_missing_counters_are_reported_and_seeded_once(backend_and_clock):
    backend, _ = backend_and_clock
    quota = counter(backend, QUOTA, limit=1_000, amount=10)
    decision = backend.admit(Plan(request_id=rid(), buckets=(rpm(backend, 5),), counters=(quota,)))
    assert not decision.admitted and decision.missing == [quota.key] and decision.refusal is None
    assert backend.counter_seed(quota.key, 995, 3600)
    assert not backend.counter_seed(quota.key, 0, 3600)  # the first seed wins
    refused = backend.admit(Plan(request_id=rid(), buckets=(rpm(backend, 5),), counters=(quota,)))
    assert refused.refusal.kind == QUOTA and refused.refusal.used == 995
    state = backend.admit(Plan(request_id=rid(), buckets=(rpm(backend, 5),))).buckets[0]
    assert state.remaining == 4  # neither the missing nor the refused attempt took a request


def admitted_then_counter_lost(backend):
    """A request holding 100 on a quota counter, whose counter then goes (expired, or dropped by Redis)."""
    quota = counter(backend, QUOTA, limit=1_000, amount=100)
    backend.counter_seed(quota.key, 0, 3600)
    request = rid()
    assert backend.admit(Plan(request_id=request, counters=(quota,))).admitted
    if backend.kind == "redis":
        backend.redis.delete(quota.key)
    else:
        backend._counters.pop(quota.key)
    return quota, request


def test_a_counter_rebuilt_while_a_request_runs_keeps_its_reservation(backend_and_clock):
    backend, _ = backend_and_clock
    quota, request = admitted_then_counter_lost(backend)
    # the rebuild: the ledger (nothing settled yet) plus the open reservations
    assert backend.open_reserved(quota.key) == 100
    backend.counter_seed(quota.key, 0 + backend.open_reserved(quota.key), 3600)
    assert [a.value for a in backend.settle(request, Actual(quota=40))] == [40]
    assert backend.counter_get(quota.key) == 40


def test_a_settlement_without_its_counter_changes_no_counter(backend_and_clock):
    backend, _ = backend_and_clock
    quota, request = admitted_then_counter_lost(backend)
    assert backend.settle(request, Actual(quota=40)) == []
    assert backend.counter_get(quota.key) is None and backend.open_reserved(quota.key) == 0


def test_a_request_id_holds_one_reservation(backend_and_clock):
    backend, _ = backend_and_clock
    request = rid()
    assert backend.admit(Plan(request_id=request, buckets=(rpm(backend, 5),))).admitted
    with pytest.raises(ValueError):
        backend.admit(Plan(request_id=request, buckets=(rpm(backend, 5),)))


def test_settle_many_settles_each_once_as_one_by_one_would(backend_and_clock):
    backend, _ = backend_and_clock
    day = 86400.0  # refill negligible between the two scopes' reads (the Redis backend runs on Redis's clock)

    scopes = {"batch": LimitScope.tenant(2), "single": LimitScope.tenant(3)}

    def plan(name: str) -> Plan:
        scope = scopes[name]
        return Plan(request_id=rid(), buckets=(Bucket(backend.key(CounterKey.rate(scope, TOKENS)), TOKENS, 6_000, 1_000,
                                                      day),),
                    slots=(Slot(backend.key(CounterKey.concurrency(scope)), 3),),
                    counters=tuple(Counter(backend.key(CounterKey.period_total(scope, "2026-11", kind)), kind, 100_000,
                                           amount, 3600)
                                   for kind, amount in ((QUOTA, 1_000), (SPEND, 900))))

    actuals = [Actual(tokens=250, quota=400, spend=300), Actual(tokens=1_000, quota=1_000, spend=900), Actual()]
    ids: dict[str, list[str]] = {}
    for scope in ("batch", "single"):
        for kind in (QUOTA, SPEND):
            backend.counter_seed(backend.key(CounterKey.period_total(scopes[scope], "2026-11", kind)), 100, 3600)
        plans = [plan(scope) for _ in actuals]
        assert all(backend.admit(p).admitted for p in plans)
        ids[scope] = [p.request_id for p in plans]
    after = backend.settle_many(list(zip(ids["batch"], actuals)) + [(rid(), Actual())])
    singles = [backend.settle(request, actual) for request, actual in zip(ids["single"], actuals)]
    # each counter once, with its value after the whole batch: the last single settlement's
    assert sorted((a.kind, a.value) for a in after) == sorted((a.kind, a.value) for a in singles[-1])
    assert sorted((a.kind, a.value) for a in after) == [(QUOTA, 100 + 400 + 1_000), (SPEND, 100 + 300 + 900)]
    assert backend.settle_many(list(zip(ids["batch"], actuals))) == []  # settled once only
    for scope in ("batch", "single"):  # the slots are free, and the same tokens came back
        again = [plan(scope) for _ in range(3)]
        decisions = [backend.admit(p) for p in again]
        assert all(d.admitted for d in decisions)
        assert decisions[0].buckets[0].remaining == 6_000 - 250 - 1_000 - 1_000  # 750 + 1000 refunded
        assert backend.open_reserved(backend.key(CounterKey.period_total(scopes[scope], "2026-11", QUOTA))) == 3_000


def test_alerts_are_marked_once(backend_and_clock):
    backend, _ = backend_and_clock
    key = alert_mark_key(backend.key(CounterKey.period_total(T1, "2026-11", SPEND)), 50)
    assert backend.alert_mark(key, 3600)
    assert not backend.alert_mark(key, 3600)


def test_concurrent_admissions_never_overshoot(backend_and_clock):
    backend, _ = backend_and_clock
    budget = counter(backend, SPEND, limit=1_000, amount=100)
    backend.counter_seed(budget.key, 0, 3600)
    results: list[bool] = []
    lock = threading.Lock()

    def one() -> None:
        decision = backend.admit(Plan(request_id=rid(), buckets=(rpm(backend, 50),), counters=(budget,)))
        with lock:
            results.append(decision.admitted)

    threads = [threading.Thread(target=one) for _ in range(40)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results.count(True) == 10
    assert backend.counter_get(budget.key) == 1_000


def test_held_counts_open_reservations_and_slots_until_each_settles(backend_and_clock):
    backend, _ = backend_and_clock
    held = LimitScope.key(99)
    slot = Slot(key=backend.key(CounterKey.concurrency(held)), limit=5)
    ids = [rid() for _ in range(3)]
    for request_id in ids:
        assert backend.admit(Plan(request_id=request_id, slots=(slot,))).admitted
    backend.admit(Plan(request_id=rid(), buckets=(rpm(backend, 100, scope=held),)))  # a reservation, no slot
    assert backend.held() == (4, 3)
    backend.settle(ids[0], Actual())
    assert backend.held() == (3, 2)
    for request_id in ids[1:]:
        backend.settle(request_id, Actual())
    assert backend.held() == (1, 0)
