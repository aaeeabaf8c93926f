"""Per local day of a tenant: requests, errors and exact time-to-first-token p50/p95, stored when a day closes.

Percentiles do not add up across hours or rollup rows, so each closed local
day's figures are computed once from its records, when the hourly rollup
fills past the day's end, and again whenever the rollup refills an hour of it
(late records). One definition serves the stored rows and the open day the
dashboard computes from the records: percentile_cont (linear interpolation
between the closest ranks), by PostgreSQL itself there and by the same
formula in Python elsewhere.
"""

from __future__ import annotations

import zoneinfo
from datetime import date, datetime, timedelta

from django.db import connection
from django.db.models import Aggregate, Count, FloatField, Q
from django.db.models.functions import TruncDate

from billing.models import DailyLatency, HourlyUsage, UsageRecord
from billing.periods import local_midnight
from tenants.models import Tenant

MARGIN = timedelta(days=2)  # a local day overlapping a refilled hour starts at most ~26 h before it


class PercentileCont(Aggregate):
    """PostgreSQL's percentile_cont(p) WITHIN GROUP (ORDER BY expression)."""

    function = "percentile_cont"
    template = "%(function)s(%(percentile)s) WITHIN GROUP (ORDER BY %(expressions)s)"
    output_field = FloatField()

    def __init__(self, expression, percentile: float, **extra):
        super().__init__(expression, percentile=float(percentile), **extra)


def percentile_cont(sorted_values: list[float], fraction: float) -> float | None:
    """percentile_cont's formula: linear interpolation between the closest ranks."""
    if not sorted_values:
        return None
    position = fraction * (len(sorted_values) - 1)
    lower = int(position)
    upper = min(lower + 1, len(sorted_values) - 1)
    return sorted_values[lower] + (sorted_values[upper] - sorted_values[lower]) * (position - lower)


def ttft_percentiles(records) -> tuple[float | None, float | None]:
    """TTFT p50 and p95 of `records` (a filtered queryset): percentile_cont, by PostgreSQL itself or in Python."""
    records = records.filter(ttft_s__isnull=False).order_by()
    if connection.vendor == "postgresql":
        row = records.aggregate(p50=PercentileCont("ttft_s", 0.5), p95=PercentileCont("ttft_s", 0.95))
        return row["p50"], row["p95"]
    samples = sorted(records.values_list("ttft_s", flat=True))
    return percentile_cont(samples, 0.5), percentile_cont(samples, 0.95)


def empty_figures() -> dict:
    return {"requests": 0, "errors": 0, "ttft_p50_s": None, "ttft_p95_s": None}


def latency_of_days(records, *, tz: str, spans: list[tuple[date, datetime, datetime]]) -> dict[date, dict]:
    """Local day -> requests, errors, ttft_p50_s, ttft_p95_s of `records` (a filtered queryset) in each span.

    `spans` are (local day, UTC start, UTC end) of zone `tz`. PostgreSQL groups by the local date and
    computes percentile_cont itself; elsewhere each day is one range scan of the (tenant, created_at) index.
    """
    out = {day: empty_figures() for day, _start, _end in spans}
    if not spans:
        return out
    records = records.order_by()
    if connection.vendor == "postgresql":
        rows = (records.filter(created_at__gte=min(s for _d, s, _e in spans), created_at__lt=max(e for _d, _s, e in spans))
                .annotate(day=TruncDate("created_at", tzinfo=zoneinfo.ZoneInfo(tz))).values("day")
                .annotate(requests=Count("id"), errors=Count("id", filter=Q(finish_reason="error")),
                          ttft_p50_s=PercentileCont("ttft_s", 0.5), ttft_p95_s=PercentileCont("ttft_s", 0.95)))
        for row in rows:
            if row["day"] in out:
                out[row.pop("day")].update(row)
        return out
    for day, start, end in spans:
        outcomes = list(records.filter(created_at__gte=start, created_at__lt=end).values_list("ttft_s", "finish_reason"))
        ttfts = sorted(ttft for ttft, _reason in outcomes if ttft is not None)
        out[day].update(requests=len(outcomes), errors=sum(reason == "error" for _ttft, reason in outcomes),
                        ttft_p50_s=percentile_cont(ttfts, 0.5), ttft_p95_s=percentile_cont(ttfts, 0.95))
    return out


def closed_spans(*, tz: str, start: datetime, end: datetime, closed_until: datetime):
    """(day, start, end) of the local days of `tz` overlapping [start, end) that end by `closed_until`."""
    zone = zoneinfo.ZoneInfo(tz)
    day = start.astimezone(zone).date()
    spans = []
    while (day_start := local_midnight(day, zone)) < end:
        day_end = local_midnight(day + timedelta(days=1), zone)
        if day_end <= closed_until:
            spans.append((day, day_start, day_end))
        day += timedelta(days=1)
    return spans


def daily_latency_refill(*, start: datetime, end: datetime, closed_until: datetime) -> int:
    """Rebuild the stored figures of every tenant's closed local days overlapping [start, end); rows written."""
    tenant_ids = (HourlyUsage.objects.filter(hour__gte=start - MARGIN, hour__lt=end).order_by()
                  .values_list("tenant_id", flat=True).distinct())
    written = 0
    for tenant in Tenant.objects.filter(pk__in=list(tenant_ids)).only("pk", "timezone"):
        spans = closed_spans(tz=tenant.timezone, start=start, end=end, closed_until=closed_until)
        if not spans:
            continue
        figures = latency_of_days(UsageRecord.objects.filter(tenant=tenant), tz=tenant.timezone, spans=spans)
        DailyLatency.objects.filter(tenant=tenant, timezone=tenant.timezone, day__in=list(figures)).delete()
        DailyLatency.objects.bulk_create([DailyLatency(tenant=tenant, timezone=tenant.timezone, day=day, **row)
                                          for day, row in figures.items()], batch_size=2000)
        written += len(figures)
    return written


def stored_latency(*, tenant: Tenant, tz: str, days) -> dict[date, dict]:
    """The stored figures of those of `days` that have them (closed days the rollup has reached)."""
    rows = (DailyLatency.objects.filter(tenant=tenant, timezone=tz, day__gte=min(days), day__lte=max(days))
            .values("day", "requests", "errors", "ttft_p50_s", "ttft_p95_s"))
    return {row.pop("day"): row for row in rows}
