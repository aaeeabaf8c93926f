"""Admission's plan of a request: every limit that applies to it (tenants.services.limits), as counters.

`plan_build` turns the request's scopes (the tenant's, the tenant's for the request's model where its tier
limits that model, the key's) into one `Plan` (billing.counters.base): requests and tokens per
minute (tokens: the prompt plus `max_tokens`), a concurrency slot, the period's token quota and budget
(the worst case, `worst_case_nanos`: every prompt token at the uncached input price plus `max_tokens` at
the output price, tier multiplier included). Each counter's key is built from its scope, kind and period
(billing.counters.keys); money is nano-dollars (billing.counters.units): a budget's micro-dollars are
converted where the plan is built, and nowhere else.

Months: quota and budget counters count a request in the month its usage record is dated (`created_at`),
as invoices do: the rule is in billing.periods. A period's counters name the next period's too
(`Counter.next_key`): a request that ends after midnight is counted there.
"""

from __future__ import annotations

from datetime import datetime
from datetime import timezone as dt_timezone

from asgiref.sync import sync_to_async
from django.conf import settings

from billing.counters.base import QUOTA, REQUESTS, SPEND, TOKENS, Bucket, Counter, Plan, Slot
from billing.counters.keys import CounterKey
from billing.counters.units import budget_micros_to_nanos, cost_femtos_to_nanos
from billing.periods import Period, month_containing, period_after
from billing.services.budgets import tenant_scope_limits
from tenants.services.limits import ScopeLimits, key_scopes, model_limits

COUNTER_MARGIN_S = 7 * 86400  # a period's counters outlive it: late settlements still find them

# ---------------------------------------------------------------- periods
_periods: dict[str, Period] = {}  # time zone -> its current month (until its end)
_following: dict[Period, Period] = {}  # a period -> the next one (a few per zone and month)


def period_current(*, tz: str) -> Period:
    """The tenant's current month (billing.periods), computed once per zone and month."""
    now = datetime.now(dt_timezone.utc)
    period = _periods.get(tz)
    if period is None or not period.contains(now):
        period = _periods[tz] = month_containing(instant=now, tz=tz)
    return period


def _period_after(period: Period) -> Period:
    following = _following.get(period)
    if following is None:
        if len(_following) > 4096:
            _following.clear()
        following = _following[period] = period_after(period)
    return following


# ---------------------------------------------------------------- the plan
def request_scopes(*, auth, model_limit=None) -> list[ScopeLimits]:
    """The limits of a request's tenant (its budget: billing.services.budgets, read with the key's row), of the
    tenant for the request's model (`model_limit`, its tier's TierModelLimit row: limits.model_limits) and of its
    key (and of the keys that made it: limits.key_scopes)."""
    per_model = model_limits(tenant=auth.tenant, row=model_limit)
    return [tenant_scope_limits(tenant=auth.tenant, tier=auth.tier), *([per_model] if per_model else []),
            *key_scopes(api_key=auth.api_key)]


def worst_case_nanos(*, model: str, tier: str, prompt_tokens: int, max_tokens: int, snapshot,
                     batch: bool = False) -> int:
    """The most the request can cost (nano-dollars): no cached prompt token, every one of `max_tokens` used;
    a Batch API line (`batch`) at the batch price it is billed at."""
    from billing.money import cost_compute

    terms = snapshot.terms_at(model, datetime.now(dt_timezone.utc))
    if batch and terms is not None:
        terms = snapshot.batch_terms_of(terms)
    cost = cost_compute(terms=terms, multiplier_milli=snapshot.multiplier_milli(tier), prompt_tokens=prompt_tokens,
                        cached_tokens=0, completion_tokens=max_tokens)
    return cost_femtos_to_nanos(cost.total)


def plan_build(*, backend, request_id: str, scopes: list[ScopeLimits], prompt_tokens: int, max_tokens: int,
               period: Period, spend_nanos: int | None, now: datetime | None = None) -> Plan:
    """Every limit of `scopes` that is set (non-zero), in one plan."""
    now = now or datetime.now(dt_timezone.utc)
    tokens = prompt_tokens + max_tokens
    ttl = max(1, int((period.end - now).total_seconds()) + COUNTER_MARGIN_S)
    following = _period_after(period)
    buckets, slots, counters = [], [], []
    for limits in scopes:
        scope = limits.scope
        if limits.requests_per_minute:
            buckets.append(Bucket(backend.key(CounterKey.rate(scope, REQUESTS)), REQUESTS,
                                  limits.requests_per_minute, 1))
        if limits.tokens_per_minute:
            buckets.append(Bucket(backend.key(CounterKey.rate(scope, TOKENS)), TOKENS, limits.tokens_per_minute,
                                  tokens))
        if limits.max_concurrent_requests:
            slots.append(Slot(backend.key(CounterKey.concurrency(scope)), limits.max_concurrent_requests))
        totals = []  # (kind, limit, amount reserved)
        if limits.monthly_token_quota:
            totals.append((QUOTA, limits.monthly_token_quota, tokens))
        if limits.monthly_spend_limit_micros and spend_nanos is not None:
            totals.append((SPEND, budget_micros_to_nanos(limits.monthly_spend_limit_micros), spend_nanos))
        for kind, limit, amount in totals:
            counters.append(Counter(backend.key(CounterKey.period_total(scope, period.label, kind)), kind, limit,
                                    amount, ttl,
                                    next_key=backend.key(CounterKey.period_total(scope, following.label, kind))))
    return Plan(request_id=request_id, buckets=tuple(buckets), slots=tuple(slots), counters=tuple(counters),
                hold_s=settings.ADMISSION_HOLD_S, lease_s=settings.ADMISSION_LEASE_S,
                period_end=period.end.timestamp())


def count_only_plan(*, backend, request_id: str, scopes: list[ScopeLimits]) -> Plan:
    """One request against the requests-per-minute limits of `scopes`, reserving nothing (empty: none)."""
    buckets = tuple(Bucket(backend.key(CounterKey.rate(limits.scope, REQUESTS)), REQUESTS,
                           limits.requests_per_minute, 1)
                    for limits in scopes if limits.requests_per_minute)
    return Plan(request_id=request_id, buckets=buckets, count_only=True)


async def pricing_snapshot() -> object:
    """The process's price snapshot; only a reload (once per PRICE_CACHE_TTL_S) leaves the event loop."""
    from billing.services import price_cache

    snapshot = price_cache.pricing_snapshot_fresh()
    if snapshot is not None:
        return snapshot
    return await sync_to_async(price_cache.pricing_snapshot)()
