"""billing.ledger: its SQL rules agree with the Python ones the records are costed by, and its sums add up."""

from __future__ import annotations

import itertools
import zoneinfo
from datetime import date, datetime, timedelta, timezone

import pytest

from billing.counters.base import QUOTA, SPEND
from billing.ledger import BILLED, CHARGED, FIGURES, SUMS, cached_clamp, is_charged, ledger_totals
from billing.models import UsageRecord
from billing.periods import day_floor, hour_floor, local_midnight
from tenants.services.limits import LimitScope

OUTCOMES = [  # (finish reason, prompt, cached, completion)
    (reason, prompt, cached, completion)
    for reason, prompt, cached, completion in itertools.product(
        ("stop", "length", "abort", "error"), (0, 700), (0, 300), (0, 5))
    if cached <= prompt
]


@pytest.mark.django_db
def test_the_charged_filter_is_is_charged_and_billed_is_what_costs_something(tenant, price_factory, record_write):
    price_factory(model="m")
    price_factory(model="free", input="0", cached="0", output="0")
    for reason, prompt, cached, completion in OUTCOMES:
        for model in ("m", "free", "unpriced"):
            record_write(tenant, model=model, finish_reason=reason, prompt_tokens=prompt, cached_tokens=cached,
                         completion_tokens=completion)
    records = UsageRecord.objects.filter(tenant=tenant)
    expected = {r.pk for r in records if is_charged(finish_reason=r.finish_reason, completion_tokens=r.completion_tokens)}
    assert set(records.filter(CHARGED).values_list("pk", flat=True)) == expected
    assert 0 < len(expected) < records.count()
    assert set(records.filter(BILLED).values_list("pk", flat=True)) == {r.pk for r in records if r.cost_femtos}


@pytest.mark.django_db
def test_the_sums_and_the_admission_totals_are_the_records_sums(tenant, price_factory, record_write):
    price_factory(model="m")
    for reason, prompt, cached, completion in OUTCOMES:
        record_write(tenant, finish_reason=reason, prompt_tokens=prompt, cached_tokens=cached,
                     completion_tokens=completion)
    records = list(UsageRecord.objects.filter(tenant=tenant))
    sums = UsageRecord.objects.filter(tenant=tenant).aggregate(**SUMS)
    assert set(sums) == set(FIGURES)
    assert sums["requests"] == len(records)
    assert sums["input_tokens"] == sum(r.prompt_tokens - r.cached_tokens for r in records)
    assert sums["cached_input_tokens"] == sum(r.cached_tokens for r in records)
    assert int(sums["cost_femtos"]) == sum(r.cost_femtos for r in records)
    start, end = min(r.created_at for r in records), max(r.created_at for r in records) + timedelta(seconds=1)
    totals = ledger_totals(scope=LimitScope.tenant(tenant.pk), start=start, end=end)
    charged = [r for r in records if is_charged(finish_reason=r.finish_reason, completion_tokens=r.completion_tokens)]
    assert totals[QUOTA] == sum(r.prompt_tokens + r.completion_tokens for r in charged)
    assert totals[SPEND] == sum(-(-r.cost_femtos // 10**6) for r in records)


@pytest.mark.parametrize(("prompt", "cached", "clamped"), [(10, 4, 4), (10, 12, 10), (10, -3, 0), (-5, 2, 0), (0, 0, 0)])
def test_cached_tokens_are_clamped_to_the_prompt(prompt, cached, clamped):
    assert cached_clamp(prompt_tokens=prompt, cached_tokens=cached) == clamped


def test_the_period_helpers():
    instant = datetime(2026, 3, 8, 10, 37, 12, 5, tzinfo=zoneinfo.ZoneInfo("America/New_York"))
    assert hour_floor(instant) == datetime(2026, 3, 8, 14, tzinfo=timezone.utc)
    assert day_floor(instant) == datetime(2026, 3, 8, tzinfo=timezone.utc)
    # the DST change of 2026-03-08: midnight is still 05:00 UTC, the next one 04:00 UTC
    zone = zoneinfo.ZoneInfo("America/New_York")
    assert local_midnight(date(2026, 3, 8), zone) == datetime(2026, 3, 8, 5, tzinfo=timezone.utc)
    assert local_midnight(date(2026, 3, 9), zone) == datetime(2026, 3, 9, 4, tzinfo=timezone.utc)
