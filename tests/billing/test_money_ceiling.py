"""Issue 45: money past the old 64-bit ceiling (9.2e18 femto-dollars: 9,223 USD) stays exact everywhere.

A large tenant's day (50,000 USD, one key, model and tier: one rollup row an
hour and a day, each far past the old ceiling) and a month (5 million USD)
are written through the worker's insert, rolled up, and read back through
the usage and costs APIs, the dashboard's selectors, the console, the
admission ledger and the invoice: each agrees with the records to the
femto-dollar. A record at the highest price a price may have, the largest
tier multiplier and the longest context a model row can declare is stored
exactly. The expected amounts are computed here with Decimal, apart from
billing's integer cost rule. Runs on SQLite and, with DATABASE_URL, on
PostgreSQL.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest
import time_machine

from billing.models import DailyUsage, HourlyUsage, UsageRecord
from billing.money import FEMTOS_PER_USD, MAX_PRICE_PER_MILLION, cents_round, usd_str
from billing.periods import month_parse
from billing.services.prices import EPOCH, price_create
from billing.services.rollups import hourly_usage_fill
from billing.services.usage import usage_records_insert
from tenants.services.limits import LimitScope
from tests.conftest import bearer

UTC = timezone.utc
OLD_CEILING = 2**63 - 1  # femto-dollars in a 64-bit column
PRICES = ("1234.567891", "617.283945", "9999.999999")  # USD per 1M input, cached input, output tokens
MULTIPLIER = "7.777"
DAY = datetime(2026, 3, 10, tzinfo=UTC)


def exact_cost(prompt: int, cached: int, completion: int, prices=PRICES, multiplier=MULTIPLIER) -> tuple[int, ...]:
    """(input, cached input, output) femto-dollars: tokens x USD per 1M / 1M x multiplier, in Decimal."""
    kinds = zip((prompt - cached, cached, completion), prices)
    amounts = [Decimal(tokens) * Decimal(price) / 10**6 * Decimal(multiplier) * FEMTOS_PER_USD for tokens, price in kinds]
    assert all(amount == amount.to_integral_value() for amount in amounts)
    return tuple(int(amount) for amount in amounts)


@pytest.fixture
def big_tenant(db, tier_factory, tenant_factory, api_key_factory):
    tier = tier_factory(price_multiplier=Decimal(MULTIPLIER))
    tenant = tenant_factory(tier=tier)
    key = api_key_factory(tenant=tenant, scopes=["usage:read", "inference"])
    price_create(model="big", input_per_million=PRICES[0], cached_input_per_million=PRICES[1],
                 output_per_million=PRICES[2], effective_from=EPOCH)
    return tenant, key


def write(tenant, key, times: list[datetime], start: int = 0) -> list[tuple[int, ...]]:
    """One record per time, through the worker's one-statement insert; their expected costs."""
    costs, rows = [], []
    for i, at in enumerate(times, start):
        prompt, cached, completion = 100_003 + i, 40_001 + i % 7, 50_007 + 3 * i
        costs.append(exact_cost(prompt, cached, completion))
        rows.append(dict(request_id=f"big-{i}", tenant_id=tenant.pk, api_key_id=key.api_key.pk, model="big",
                         tier=tenant.tier.name, prompt_tokens=prompt, cached_tokens=cached,
                         completion_tokens=completion, finish_reason="stop", admitted_at=at, created_at=at))
    for first in range(0, len(rows), 200):
        usage_records_insert(rows[first:first + 200])
    return costs


def costs_api_days(api_client, key, start: datetime, days: int) -> dict[int, Decimal]:
    response = api_client.get("/v1/organization/costs", {
        "start_time": int(start.timestamp()), "end_time": int((start + timedelta(days=days)).timestamp()),
        "limit": days}, **bearer(key.key))
    assert response.status_code == 200, response.content
    return {bucket["start_time"]: sum((Decimal(r["amount"]["value_decimal"]) for r in bucket["results"]), Decimal(0))
            for bucket in response.json()["data"]}


def check_everything(api_client, tenant, key, costs, *, start: datetime, days: int, now: datetime) -> None:
    from billing.counters.base import SPEND
    from billing.ledger import ledger_totals
    from billing.services.invoices import invoice_draft_refresh
    from dashboard.selectors.console import spend_by_tenant
    from billing.selectors import days_between
    from dashboard.selectors.overview import overview_get
    from dashboard.selectors.usage import usage_by_day

    total = sum(sum(cost) for cost in costs)
    assert total > OLD_CEILING  # what a 64-bit column or SQLite's integer SUM could not hold
    end = start + timedelta(days=days)
    stored = UsageRecord.objects.filter(tenant=tenant).values_list(
        "input_cost_femtos", "cached_input_cost_femtos", "output_cost_femtos", "cost_femtos")
    assert sorted(stored) == sorted((*cost, sum(cost)) for cost in costs)
    with time_machine.travel(now, tick=False):
        api = costs_api_days(api_client, key, start, days)
        by_day = usage_by_day(tenant=tenant, days=days_between(first=start.date(), last=(end - timedelta(1)).date(),
                                                               tz=tenant.timezone))
        overview = overview_get(tenant=tenant, now=end - timedelta(seconds=1))
    assert sum(api.values()) == Decimal(total).scaleb(-15)
    assert sum(figures["cost_femtos"] for figures in by_day.values()) == total
    for kind, column in enumerate(("input_cost_femtos", "cached_input_cost_femtos", "output_cost_femtos")):
        assert sum(figures[column] for figures in by_day.values()) == sum(cost[kind] for cost in costs)
    if days < 28:  # the month so far of a day's test is that day
        assert overview.spend_usd == Decimal(total).scaleb(-15)
    assert spend_by_tenant(start=start, end=end)[tenant.pk] == total
    spend = ledger_totals(scope=LimitScope.tenant(tenant.pk), kinds=(SPEND,), start=start, end=end)[SPEND]
    assert spend == sum(-(-sum(cost) // 10**6) for cost in costs)  # each record rounded up to a nano-dollar
    invoice = invoice_draft_refresh(tenant=tenant, period=month_parse(label=f"{start:%Y-%m}", tz=tenant.timezone),
                                    now=now)
    lines = list(invoice.lines.all())
    assert sum(Decimal(line.exact_usd) for line in lines) == Decimal(total).scaleb(-15)
    assert invoice.total_cents == sum(int(cents_round(Decimal(line.exact_usd)) * 100) for line in lines)


@pytest.mark.django_db
def test_a_day_at_50000_usd_agrees_to_the_femto_dollar(api_client, big_tenant):
    tenant, key = big_tenant
    times = [DAY + timedelta(hours=10, minutes=4 * i) for i in range(11)]  # all in one hour: one hour row
    costs = write(tenant, key, times)
    total = sum(sum(cost) for cost in costs)
    assert total >= 50_000 * FEMTOS_PER_USD
    # before the rollup reaches the day: every figure from the records
    check_everything(api_client, tenant, key, costs, start=DAY, days=1, now=DAY + timedelta(hours=23))
    hourly_usage_fill(now=DAY + timedelta(days=1))
    [hour] = HourlyUsage.objects.filter(tenant=tenant)
    [day] = DailyUsage.objects.filter(tenant=tenant)
    for row in (hour, day):
        assert row.cost_femtos == total > OLD_CEILING
        assert (row.input_cost_femtos, row.cached_input_cost_femtos, row.output_cost_femtos) == tuple(
            sum(cost[kind] for cost in costs) for kind in range(3))
    # and from the rollups
    check_everything(api_client, tenant, key, costs, start=DAY, days=1, now=DAY + timedelta(days=2))


@pytest.mark.django_db
def test_a_month_at_5_million_usd_agrees_to_the_femto_dollar(api_client, big_tenant):
    tenant, key = big_tenant
    month = datetime(2026, 4, 1, tzinfo=UTC)
    times = [month + timedelta(days=i // 36, minutes=37 * (i % 36)) for i in range(30 * 36)]
    costs = write(tenant, key, times)
    assert sum(sum(cost) for cost in costs) >= 5_000_000 * FEMTOS_PER_USD
    hourly_usage_fill(now=month + timedelta(days=20))  # days from the daily rollup, hours, then the records
    check_everything(api_client, tenant, key, costs, start=month, days=30, now=month + timedelta(days=30, hours=1))
    hourly_usage_fill(now=month + timedelta(days=31))
    assert sum(DailyUsage.objects.filter(tenant=tenant).values_list("cost_femtos", flat=True)) == sum(
        sum(cost) for cost in costs)
    check_everything(api_client, tenant, key, costs, start=month, days=30, now=month + timedelta(days=32))


@pytest.mark.django_db
def test_a_record_at_the_highest_price_multiplier_and_context_is_stored_exactly(tier_factory, tenant_factory):
    """The bound a price may have (MAX_PRICE_PER_MILLION, set through the validating service), the largest tier
    multiplier its column holds (999.999) and the longest context a model row can declare (a positive integer
    column: 2**31 - 1 tokens)."""
    from billing.services.invoices import invoice_draft_refresh
    from inference.models import ServedModel

    context = ServedModel._meta.get_field("context_length")
    longest = 2**31 - 1
    ServedModel.objects.create(name="huge", source="gguf:/nowhere.gguf", context_length=longest)
    assert ServedModel.objects.get(name="huge").context_length == longest and context.get_internal_type() == (
        "PositiveIntegerField")
    top = str(MAX_PRICE_PER_MILLION)
    price_create(model="huge", input_per_million=top, cached_input_per_million=top, output_per_million=top,
                 effective_from=EPOCH)
    tenant = tenant_factory(tier=tier_factory(price_multiplier=Decimal("999.999")))
    completion, cached = 1_000, 2**30
    prompt = longest - completion
    want = exact_cost(prompt, cached, completion, prices=(top,) * 3, multiplier="999.999")
    at = datetime(2026, 5, 2, tzinfo=UTC)
    usage_records_insert([dict(request_id="huge-1", tenant_id=tenant.pk, api_key_id=None, model="huge",
                               tier=tenant.tier.name, prompt_tokens=prompt, cached_tokens=cached,
                               completion_tokens=completion, finish_reason="length", admitted_at=at, created_at=at)])
    record = UsageRecord.objects.get(request_id="huge-1")
    assert (record.input_cost_femtos, record.cached_input_cost_femtos, record.output_cost_femtos) == want
    assert record.cost_femtos == sum(want) > 2 * 10**25  # 2.1e10 USD
    assert usd_str(record.cost_femtos) == format(Decimal(longest) * Decimal("0.01") * Decimal("999.999"), "f")
    from billing.counters.base import QUOTA, SPEND
    from billing.ledger import ledger_totals

    totals = ledger_totals(scope=LimitScope.tenant(tenant.pk), start=at, end=at + timedelta(days=1))
    assert totals == {QUOTA: longest, SPEND: -(-sum(want) // 10**6)}
    # the columns hold a longest prompt plus an answer past it: the ledger's token sum does not overflow either
    usage_records_insert([dict(request_id="huge-2", tenant_id=tenant.pk, api_key_id=None, model="huge",
                               tier=tenant.tier.name, prompt_tokens=longest, cached_tokens=0,
                               completion_tokens=completion, finish_reason="length", admitted_at=at, created_at=at)])
    totals = ledger_totals(scope=LimitScope.tenant(tenant.pk), kinds=(QUOTA,), start=at, end=at + timedelta(days=1))
    assert totals == {QUOTA: 2 * longest + completion}
    UsageRecord.objects.filter(request_id="huge-2").delete()
    hourly_usage_fill(now=at + timedelta(days=1))
    assert HourlyUsage.objects.get(tenant=tenant).cost_femtos == sum(want)
    invoice = invoice_draft_refresh(tenant=tenant, period=month_parse(label="2026-05", tz="UTC"),
                                    now=at + timedelta(days=1))
    assert sum(Decimal(line.exact_usd) for line in invoice.lines.all()) == Decimal(sum(want)).scaleb(-15)
