"""Celery beat down for a day, then back: the rollups and the invoices catch up and equal what the
beat, running all along, would have made.

The same usage (records across a month's end, in two tenants' time zones, one written a day late by a
worker's spool with its own time) is rolled up and invoiced twice on the same database: once by the
beat tasks run every hour (the clock moved with time-machine), once by one run of each after 30 hours
of silence. Hourly and daily rollups, invoice statuses, totals and lines must be the same.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
import time_machine

from billing.models import DailyUsage, FillState, HourlyUsage, Invoice, InvoiceLine
from billing.tasks import close_invoices, rollup_hourly_usage
from tests.billing.test_rollups import FIELDS

START = datetime(2026, 3, 31, 6, tzinfo=timezone.utc)  # the beat's last run before it went down
END = START + timedelta(hours=30)  # back the next day, past April's start plus the grace hour


def _state() -> dict:
    hourly = sorted((r.hour, r.tenant_id, r.api_key_id, r.model, r.tier, *(getattr(r, f) for f in FIELDS))
                    for r in HourlyUsage.objects.all())
    daily = sorted((r.day, r.tenant_id, r.api_key_id, r.model, r.tier, *(getattr(r, f) for f in FIELDS))
                   for r in DailyUsage.objects.all())
    invoices = sorted((i.tenant_id, i.period, i.kind, i.status, i.total_cents, i.number) for i in Invoice.objects.all())
    lines = sorted((line.invoice.number, line.position, line.kind, line.model, line.description, line.amount_cents)
                   for line in InvoiceLine.objects.select_related("invoice"))
    return {"hourly": hourly, "daily": daily, "invoices": invoices, "lines": lines}


def _reset() -> None:
    InvoiceLine.objects.all().delete()
    Invoice.objects.all().delete()
    HourlyUsage.objects.all().delete()
    DailyUsage.objects.all().delete()
    FillState.objects.all().delete()


def _beat(when: datetime) -> None:
    with time_machine.travel(when, tick=False):
        rollup_hourly_usage()
        close_invoices()


@pytest.mark.django_db
def test_beat_down_for_a_day_catches_up_to_what_it_would_have_made(tenant_factory, price_factory, record_write):
    price_factory()
    utc = tenant_factory(slug="utc-co", timezone="UTC")
    tokyo = tenant_factory(slug="tokyo-co", timezone="Asia/Tokyo")
    with time_machine.travel(START - timedelta(hours=1), tick=False):
        for tenant in (utc, tokyo):
            record_write(tenant, created_at=START - timedelta(hours=2), completion_tokens=10)
    for hours in (1, 5, 17, 19, 25):  # both months (UTC, and Tokyo's month ends 9 hours earlier)
        when = START + timedelta(hours=hours, minutes=7)
        for tenant in (utc, tokyo):
            record_write(tenant, created_at=when, completion_tokens=hours * 3)
    # a record a worker's spool wrote late (after a database outage), with the time its request ended
    record_write(utc, created_at=START + timedelta(hours=16, minutes=59), completion_tokens=41)
    _beat(START)
    baseline_fill = FillState.objects.get().end

    # the beat running all along: every hour
    when = START
    while when < END:
        when += timedelta(hours=1)
        _beat(when)
    running = _state()

    # the beat down from START to END, then one run of each task
    _reset()
    _beat(START)
    assert FillState.objects.get().end == baseline_fill
    _beat(END)
    caught_up = _state()

    assert caught_up == running
    assert running["hourly"] and running["daily"]
    statuses = {(tenant_id, period): status for tenant_id, period, _k, status, _t, _n in running["invoices"]}
    assert statuses[(utc.pk, "2026-03")] == Invoice.Status.FINALIZED  # closed while the beat was down
    assert statuses[(utc.pk, "2026-04")] == Invoice.Status.DRAFT
