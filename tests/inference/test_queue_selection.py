"""The pull policy on its own: smooth weighted round-robin and the tenant ring."""

from __future__ import annotations

from collections import Counter

import pytest

from inference.queue.selection import DbTierWeights, TenantRing, TierSelector


def test_swrr_sequence_is_smooth_and_exact_per_cycle():
    selector = TierSelector({"enterprise": 8, "free": 1})
    plan = selector.plan({"enterprise": 100, "free": 100}, 18)
    # The free pull sits in the middle of each cycle of 9, not at its end.
    assert plan == (["enterprise"] * 4 + ["free"] + ["enterprise"] * 4) * 2


def test_plan_never_takes_more_than_is_queued_and_redistributes():
    selector = TierSelector({"enterprise": 8, "pro": 4, "free": 1})
    plan = selector.plan({"enterprise": 1, "pro": 0, "free": 5}, 10)
    assert Counter(plan) == {"enterprise": 1, "free": 5}
    assert plan[0] == "enterprise"
    assert selector.plan({}, 5) == [] and selector.plan({"free": 3}, 0) == []


def test_state_carries_across_calls_but_idle_tiers_lose_credit():
    selector = TierSelector({"a": 2, "b": 1})
    picks = [selector.plan({"a": 9, "b": 9}, 1)[0] for _ in range(6)]
    assert Counter(picks) == {"a": 4, "b": 2}
    selector.plan({"b": 9}, 3)  # "a" idle: its credit is dropped
    assert selector.plan({"a": 9, "b": 9}, 1) == ["a"]


def test_zero_weight_still_gets_served():
    selector = TierSelector({"a": 0, "b": 3})
    assert Counter(selector.plan({"a": 50, "b": 50}, 8)) == {"b": 6, "a": 2}


def test_tenant_ring_round_robin_and_front_requeue():
    ring = TenantRing()
    for tenant, item in [("1", "a1"), ("1", "a2"), ("1", "a3"), ("2", "b1"), ("3", "c1")]:
        ring.push(tenant, item)
    assert [ring.pop() for _ in range(3)] == ["a1", "b1", "c1"]
    ring.push("3", "c0", front=True)
    assert ring.size == 3
    assert [ring.pop() for _ in range(4)] == ["c0", "a2", "a3", None]
    ring.push("4", "d1")
    assert ring.remove("4", "d1") and not ring.remove("4", "d1")
    assert ring.pop() is None and ring.size == 0 and not ring.ring


@pytest.mark.django_db
def test_db_tier_weights_read_tiers(tier_factory):
    tier_factory("gold", queue_weight=7)
    tier_factory("tin", queue_weight=1)
    weights = DbTierWeights(ttl=60)
    assert weights()["gold"] == 7 and weights()["tin"] == 1


def test_db_tier_weights_without_database_access_keep_defaults():
    # pytest-django blocks the database here: the provider must shrug it off.
    assert dict(DbTierWeights()()) == {}
