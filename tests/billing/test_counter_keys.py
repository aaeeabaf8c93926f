"""The admission counters' keys (billing.counters.keys) and money units (billing.counters.units).

The literal keys below were read off the code before the keys were typed (`backend.key("rb", "t12",
"requests")` and so on): they are the live counters' names in Redis, shared by old and new code during a
rolling deploy, so they must stay byte for byte.
"""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from billing.counters.base import CONCURRENCY, QUOTA, REQUESTS, SPEND, TOKENS
from billing.counters.keys import CounterKey, alert_mark_key, reservation_key, slots_match
from billing.counters.memory import MemoryAdmission
from billing.counters.redis_backend import RedisAdmission
from billing.counters.units import budget_micros_to_nanos, cost_femtos_to_nanos, nanos_usd
from billing.periods import month_period
from tenants.services.limits import LimitScope, ScopeLimits

T12, K34 = LimitScope.tenant(12), LimitScope.key(34)

PINNED = [  # (counter, key in process, key on Redis under ADMISSION_KEY_PREFIX "lim")
    (CounterKey.rate(T12, REQUESTS), "rb:t12:requests", "{lim}:rb:t12:requests"),
    (CounterKey.rate(K34, TOKENS), "rb:k34:tokens", "{lim}:rb:k34:tokens"),
    (CounterKey.concurrency(K34), "cc:k34", "{lim}:cc:k34"),
    (CounterKey.period_total(T12, "2026-03", QUOTA), "q:t12:2026-03:quota", "{lim}:q:t12:2026-03:quota"),
    (CounterKey.period_total(K34, "2026-12", SPEND), "q:k34:2026-12:spend", "{lim}:q:k34:2026-12:spend"),
]


def _redis_backend() -> RedisAdmission:
    return RedisAdmission(url="redis://127.0.0.1:6379/12", prefix="lim")  # (connects on its first call only)


@pytest.mark.parametrize("counter, in_process, on_redis", PINNED)
def test_keys_are_byte_identical_to_the_untyped_ones(counter, in_process, on_redis):
    assert MemoryAdmission().key(counter) == counter.render() == in_process
    assert _redis_backend().key(counter) == counter.render("{lim}") == on_redis


@pytest.mark.parametrize("counter, in_process, on_redis", PINNED)
def test_a_key_parses_back_to_its_counter(counter, in_process, on_redis):
    assert CounterKey.parse(in_process) == counter
    assert CounterKey.parse(on_redis, prefix="{lim}") == counter
    prefixed = counter.render("{lim-test:0f3a}")  # a test's prefix holds a colon
    assert CounterKey.parse(prefixed, prefix="{lim-test:0f3a}") == counter


def test_the_alert_mark_the_slots_pattern_and_a_reservation_are_unchanged():
    spend = _redis_backend().key(CounterKey.period_total(T12, "2026-03", SPEND))
    assert alert_mark_key(spend, 80) == "{lim}:q:t12:2026-03:spend:alert:80"
    assert slots_match("{lim}") == "{lim}:cc:*"
    assert slots_match("") == "cc:*"
    assert reservation_key("{lim}", "req-1") == "{lim}:res:req-1"  # (the Lua scripts' own: P:res:RID)


def test_units():
    assert [CounterKey.rate(T12, REQUESTS).unit, CounterKey.rate(T12, TOKENS).unit,
            CounterKey.concurrency(T12).unit, CounterKey.period_total(T12, "2026-03", QUOTA).unit,
            CounterKey.period_total(T12, "2026-03", SPEND).unit] == ["requests", "tokens", "requests", "tokens",
                                                                      "nanos"]
    assert CounterKey.concurrency(K34).kind == CONCURRENCY


@pytest.mark.parametrize("junk", ["", "rb:t12", "rb:t12:spend", "rb:x12:requests", "cc:t12:requests", "cc:t-1",
                                  "q:t12:2026-03", "q:t12:2026-03:tokens", "q:t12::quota", "zz:t12:requests",
                                  "{lim}:rb:t12:requests", "rb:t12:requests:extra"])
def test_parse_refuses_what_is_not_a_counter_key(junk):
    with pytest.raises(ValueError):
        CounterKey.parse(junk)


def test_parse_refuses_a_key_under_another_prefix():
    with pytest.raises(ValueError):
        CounterKey.parse("{other}:rb:t12:requests", prefix="{lim}")


@pytest.mark.parametrize("make", [lambda: CounterKey.rate(T12, QUOTA), lambda: CounterKey.period_total(T12, "", SPEND),
                                  lambda: CounterKey.period_total(T12, "2026:03", SPEND),
                                  lambda: CounterKey.period_total(T12, "2026-03", TOKENS)])
def test_a_counter_is_built_from_parts_that_fit(make):
    with pytest.raises(ValueError):
        make()


def test_a_plan_names_the_same_keys_as_before(settings):
    """plan_build's keys for a tenant and a key with every limit set, as the untyped code wrote them."""
    from billing.services.admission_plan import plan_build

    limits = dict(requests_per_minute=10, tokens_per_minute=1_000, max_concurrent_requests=2,
                  monthly_token_quota=50_000, monthly_spend_limit_micros=5_000_000)
    scopes = [ScopeLimits(scope=T12, **limits), ScopeLimits(scope=K34, **limits)]
    period = month_period(year=2026, month=3, tz="UTC")
    plan = plan_build(backend=_redis_backend(), request_id="r", scopes=scopes, prompt_tokens=10, max_tokens=20,
                      period=period, spend_nanos=777, now=datetime(2026, 3, 5, tzinfo=timezone.utc))
    assert [b.key for b in plan.buckets] == ["{lim}:rb:t12:requests", "{lim}:rb:t12:tokens",
                                             "{lim}:rb:k34:requests", "{lim}:rb:k34:tokens"]
    assert [s.key for s in plan.slots] == ["{lim}:cc:t12", "{lim}:cc:k34"]
    assert [(c.key, c.next_key) for c in plan.counters] == [
        ("{lim}:q:t12:2026-03:quota", "{lim}:q:t12:2026-04:quota"),
        ("{lim}:q:t12:2026-03:spend", "{lim}:q:t12:2026-04:spend"),
        ("{lim}:q:k34:2026-03:quota", "{lim}:q:k34:2026-04:quota"),
        ("{lim}:q:k34:2026-03:spend", "{lim}:q:k34:2026-04:spend"),
    ]
    spend = [c for c in plan.counters if c.kind == SPEND]
    assert [(c.limit, c.amount) for c in spend] == [(5_000_000_000, 777)] * 2  # $5 in nano-dollars


def test_money_enters_admission_in_nano_dollars():
    assert budget_micros_to_nanos(5_000_000) == 5_000_000_000  # $5
    assert budget_micros_to_nanos(1) == 1_000
    assert [cost_femtos_to_nanos(f) for f in (0, 1, 10**6, 10**6 + 1, 3 * 10**6)] == [0, 1, 1, 2, 3]  # rounded up
    assert nanos_usd(5_000_000_000) == "5.00"
    assert nanos_usd(950_000) == "0.00095"
    assert nanos_usd(1) == "0.000001"  # rounded up to a micro-dollar
