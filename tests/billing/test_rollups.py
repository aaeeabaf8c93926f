"""Hourly rollups: sums equal the records', idempotent, late records folded in, rebuilds equal, crash-safe."""

from collections import Counter
from datetime import datetime, timedelta, timezone

import pytest
import time_machine

from billing.models import DailyUsage, FillState, HourlyUsage, UsageRecord
from billing.services import rollups
from billing.services.rollups import hourly_usage_fill, hourly_usage_rebuild
from billing.tasks import rollup_hourly_usage

H10 = datetime(2026, 3, 2, 10, tzinfo=timezone.utc)
FIELDS = ("requests", "input_tokens", "cached_input_tokens", "output_tokens", "input_cost_femtos",
          "cached_input_cost_femtos", "output_cost_femtos", "cost_femtos")


def at(when: datetime, write, *args, **kwargs):
    with time_machine.travel(when, tick=False):
        return write(*args, **kwargs)


def rollup_table() -> Counter:
    return Counter({(r.hour, r.tenant_id, r.api_key_id, r.model, r.tier): tuple(getattr(r, f) for f in FIELDS)
                    for r in HourlyUsage.objects.all()})


def days_are_sums_of_hours() -> bool:
    hours: dict = {}
    for r in HourlyUsage.objects.all():
        key = (r.hour.replace(hour=0), r.tenant_id, r.api_key_id, r.model, r.tier)
        hours[key] = tuple(a + b for a, b in zip(hours.get(key, (0,) * 8), (getattr(r, f) for f in FIELDS)))
    days = {(r.day, r.tenant_id, r.api_key_id, r.model, r.tier): tuple(getattr(r, f) for f in FIELDS)
            for r in DailyUsage.objects.all()}
    return bool(days) and days == hours


def records_table() -> Counter:
    table: dict = {}
    for r in UsageRecord.objects.all():
        key = (r.created_at.replace(minute=0, second=0, microsecond=0), r.tenant_id, r.api_key_id, r.model, r.tier)
        row = (1, r.prompt_tokens - r.cached_tokens, r.cached_tokens, r.completion_tokens, r.input_cost_femtos,
               r.cached_input_cost_femtos, r.output_cost_femtos, r.cost_femtos)
        table[key] = tuple(a + b for a, b in zip(table.get(key, (0,) * 8), row))
    return Counter(table)


@pytest.fixture
def usage(tenant_factory, api_key_factory, price_factory, record_write):
    price_factory(model="m")
    price_factory(model="n", input="3", cached="1", output="7")
    a, b = tenant_factory(), tenant_factory()
    keys = [api_key_factory(tenant=a).api_key, api_key_factory(tenant=a).api_key, api_key_factory(tenant=b).api_key]
    for i in range(24):
        tenant = a if i % 3 else b
        key = keys[2] if tenant is b else keys[i % 2]
        at(H10 + timedelta(minutes=7 * i), record_write, tenant, key, model="mn"[i % 2], prompt_tokens=100 + i,
           cached_tokens=i, completion_tokens=10 + i)
    return a, b, keys


@pytest.mark.django_db
def test_fill_sums_equal_the_records_and_rerunning_changes_nothing(usage):
    result = hourly_usage_fill(now=H10 + timedelta(hours=3, minutes=5))
    assert result.end == H10 + timedelta(hours=3)
    assert rollup_table() == records_table() and HourlyUsage.objects.count() > 6
    assert days_are_sums_of_hours()
    before = rollup_table()
    hourly_usage_fill(now=H10 + timedelta(hours=3, minutes=10))
    assert rollup_table() == before


@pytest.mark.django_db
def test_only_complete_hours_are_filled(usage):
    hourly_usage_fill(now=H10 + timedelta(hours=1, minutes=30))
    assert set(HourlyUsage.objects.values_list("hour", flat=True)) == {H10}


@pytest.mark.django_db
def test_late_records_are_folded_in_by_the_next_run(usage, record_write):
    a, _b, keys = usage
    hourly_usage_fill(now=H10 + timedelta(hours=5))
    # a finish that commits long after its hour was rolled up (an old created_at, a new id)
    late = at(H10 + timedelta(minutes=59), record_write, a, keys[0], model="m", completion_tokens=999)
    assert rollup_table() != records_table()
    result = hourly_usage_fill(now=H10 + timedelta(hours=5, minutes=5))
    assert result.late_hours == 1 and late.created_at < result.end - rollups.LOOKBACK
    assert rollup_table() == records_table() and days_are_sums_of_hours()


@pytest.mark.django_db
def test_a_rebuild_equals_what_it_replaced(usage):
    hourly_usage_fill(now=H10 + timedelta(hours=4))
    before = rollup_table()
    HourlyUsage.objects.filter(hour=H10 + timedelta(hours=1)).update(requests=0, cost_femtos=1)  # damage
    hourly_usage_rebuild(start=H10, end=H10 + timedelta(hours=4))
    assert rollup_table() == before


@pytest.mark.django_db
def test_a_crash_mid_fill_leaves_nothing_half_done(usage, monkeypatch):
    calls = []
    real = rollups.hourly_rows

    def crashing(**kwargs):
        calls.append(kwargs)
        raise RuntimeError("worker killed")

    monkeypatch.setattr(rollups, "hourly_rows", crashing)
    with pytest.raises(RuntimeError):
        hourly_usage_fill(now=H10 + timedelta(hours=4))
    assert calls and not HourlyUsage.objects.exists() and not FillState.objects.exists()
    monkeypatch.setattr(rollups, "hourly_rows", real)
    hourly_usage_fill(now=H10 + timedelta(hours=4))
    assert rollup_table() == records_table()


@pytest.mark.django_db
def test_the_beat_task_fills(usage):
    with time_machine.travel(H10 + timedelta(hours=6), tick=False):
        rollup_hourly_usage.apply()  # in-process, as the eager embedded default runs it
    assert rollup_table() == records_table()
    assert FillState.objects.get().end == H10 + timedelta(hours=6)
