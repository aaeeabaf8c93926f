"""The dashboard's per-day figures equal the ledger's sums per local day, whatever the zone and the rollup's state."""

from __future__ import annotations

import zoneinfo
from datetime import date, datetime, timedelta
from datetime import timezone as dt_timezone

import pytest

from billing.models import DailyLatency, UsageRecord
from billing.services.latency_rollups import percentile_cont
from billing.services.rollups import hourly_usage_fill
from billing.usage_buckets import FIGURES
from billing.selectors import days_between
from dashboard.selectors.usage import latency_by_day, usage_by_day

UTC = dt_timezone.utc


def ledger_by_day(records, tz: str, days, *, model=None, key_id=None) -> dict[date, dict[str, int]]:
    zone = zoneinfo.ZoneInfo(tz)
    out = {day: dict.fromkeys(FIGURES, 0) for day in days}
    for r in records:
        if (model and r.model != model) or (key_id and r.api_key_id != key_id):
            continue
        day = r.created_at.astimezone(zone).date()
        if day not in out:
            continue
        sums = out[day]
        sums["requests"] += 1
        sums["input_tokens"] += r.prompt_tokens - r.cached_tokens
        sums["cached_input_tokens"] += r.cached_tokens
        sums["output_tokens"] += r.completion_tokens
        sums["input_cost_femtos"] += r.input_cost_femtos
        sums["cached_input_cost_femtos"] += r.cached_input_cost_femtos
        sums["output_cost_femtos"] += r.output_cost_femtos
        sums["cost_femtos"] += r.cost_femtos
    return out


@pytest.mark.parametrize("tz", ["UTC", "America/Los_Angeles", "Asia/Kolkata", "Asia/Kathmandu"])
def test_days_equal_the_ledger(tenant_factory, seed_usage, api_key_factory, tz):
    tenant = tenant_factory(timezone=tz)
    keys = [api_key_factory(tenant=tenant).api_key for _ in range(2)]
    start = datetime(2026, 3, 6, 0, tzinfo=UTC)  # spans the US DST change of 2026-03-08
    records = seed_usage(tenant, start=start, hours=24 * 6, per_hour=2, keys=keys)
    # half rolled up (days, hours), the rest still only records
    hourly_usage_fill(now=start + timedelta(days=3, hours=7))
    days = days_between(first=date(2026, 3, 6), last=date(2026, 3, 11), tz=tz)
    assert usage_by_day(tenant=tenant, days=days) == ledger_by_day(records, tz, days.days)
    filtered = usage_by_day(tenant=tenant, days=days, api_key_ids=(keys[0].pk,), models=("m-dash",))
    assert filtered == ledger_by_day(records, tz, days.days, key_id=keys[0].pk)
    assert sum(f["requests"] for f in filtered.values()) < len(records)


def assert_latency_equals_records(tenant, days, records, tz):
    figures = latency_by_day(tenant=tenant, days=days)
    zone = zoneinfo.ZoneInfo(tz)
    for day in days.days:
        mine = [r for r in records if r.created_at.astimezone(zone).date() == day]
        ttfts = sorted(r.ttft_s for r in mine if r.ttft_s is not None)
        errors = sum(r.finish_reason == "error" for r in mine)
        assert figures[day]["requests"] == len(mine) and figures[day]["errors"] == errors
        assert figures[day]["error_rate"] == (errors / len(mine) if mine else 0.0)
        for name, fraction in (("ttft_p50_s", 0.5), ("ttft_p95_s", 0.95)):
            expected = percentile_cont(ttfts, fraction)
            assert figures[day][name] == (None if expected is None else round(expected, 4))


def test_latency_and_error_rate_per_day(tenant_factory, seed_usage):
    tenant = tenant_factory(timezone="Europe/Paris")
    start = datetime(2026, 5, 1, tzinfo=UTC)
    records = seed_usage(tenant, start=start, hours=48, per_hour=5)
    days = days_between(first=date(2026, 5, 1), last=date(2026, 5, 3), tz="Europe/Paris")
    assert_latency_equals_records(tenant, days, records, "Europe/Paris")


def test_stored_latency_of_closed_days_equals_the_records_after_a_late_record(tenant_factory, seed_usage):
    tz = "America/New_York"
    tenant = tenant_factory(timezone=tz)
    start = datetime(2026, 5, 1, 4, tzinfo=UTC)  # local midnight of May 1st
    records = seed_usage(tenant, start=start, hours=24 * 3, per_hour=4)
    hourly_usage_fill(now=start + timedelta(days=2, hours=10))  # May 1st and 2nd closed, the 3rd open
    stored = {row.day: row for row in DailyLatency.objects.filter(tenant=tenant, timezone=tz)}
    assert sorted(stored) == [date(2026, 5, 1), date(2026, 5, 2)]
    days = days_between(first=date(2026, 5, 1), last=date(2026, 5, 3), tz=tz)
    assert_latency_equals_records(tenant, days, records, tz)
    # a late record, written into a closed day after its hours were filled: the next run rebuilds that day
    late = UsageRecord.objects.create(
        request_id="dash-late-latency", tenant=tenant, model="m-dash", tier=tenant.tier.name, prompt_tokens=1,
        completion_tokens=1, finish_reason="stop", ttft_s=9.5, created_at=start + timedelta(hours=3),
        admitted_at=start + timedelta(hours=3), price=records[0].price)
    before = DailyLatency.objects.get(tenant=tenant, timezone=tz, day=date(2026, 5, 1))
    hourly_usage_fill(now=start + timedelta(days=2, hours=11))
    after = DailyLatency.objects.get(tenant=tenant, timezone=tz, day=date(2026, 5, 1))
    assert after.requests == before.requests + 1 and after.ttft_p95_s != before.ttft_p95_s
    assert_latency_equals_records(tenant, days, [*records, late], tz)


def test_percentile_cont_interpolates():
    assert percentile_cont([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert percentile_cont([1.0, 2.0, 3.0, 4.0], 0.95) == pytest.approx(3.85)
    assert percentile_cont([], 0.5) is None
