"""A tenant's usage per local day: tokens by kind, requests, spend (from billing's rollups and records),
and time to first token and error rate (from the records).

Token and cost figures go through billing.usage_buckets (whole days or hours
from the rollups, the part the rollup has not reached from the records), so
they are the ledger's integers. A day is a local day of the tenant
(selectors.days); TTFT percentiles are percentile_cont (linear interpolation)
on PostgreSQL and the same formula in Python elsewhere.
"""

from __future__ import annotations

from datetime import date, timedelta

from django.db import connection
from django.db.models import Aggregate, Case, Count, FloatField, IntegerField, Q, Value, When

from billing.models import UsageRecord
from billing.usage_buckets import FIGURES, Query, usage_sums
from dashboard.selectors.days import HOUR, Days, hour_floor
from tenants.models import Tenant

MAX_RANGE_DAYS = 92  # the usage page's longest range


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


def _empty() -> dict[str, int]:
    return dict.fromkeys(FIGURES, 0)


def _add_into(target: dict[str, int], sums: dict[str, int]) -> None:
    for name in FIGURES:
        target[name] += sums[name]


def _sums(tenant: Tenant, start, end, width: str, models, api_key_ids):
    return usage_sums(Query(tenant=tenant, start=start, end=end, width=width, models=tuple(models),
                            api_key_ids=tuple(api_key_ids)))


def usage_by_day(*, tenant: Tenant, days: Days, models=(), api_key_ids=()) -> dict[date, dict[str, int]]:
    """Local day -> billing's FIGURES (requests, tokens by kind, costs in femto-USD), every day present."""
    out = {day: _empty() for day in days.days}
    if days.utc_days:
        for bucket, groups in _sums(tenant, days.start, days.end, "1d", models, api_key_ids).items():
            day = days.day_of(bucket)
            if day is not None:
                for sums in groups.values():
                    _add_into(out[day], sums)
        return out
    split = set(days.split_hours())
    end = hour_floor(days.end) + (HOUR if days.end != hour_floor(days.end) else timedelta(0))
    buckets = dict(_sums(tenant, hour_floor(days.start), end, "1h", models, api_key_ids))
    for hour in split:  # the hours two local days share: per minute, from the records
        for bucket in list(buckets):
            if bucket == hour:
                del buckets[bucket]
        buckets.update(_sums(tenant, hour, hour + HOUR, "1m", models, api_key_ids))
    for bucket, groups in buckets.items():
        day = days.day_of(bucket)
        if day is not None:
            for sums in groups.values():
                _add_into(out[day], sums)
    return out


def _records(tenant: Tenant, days: Days, models, api_key_ids):
    records = UsageRecord.objects.filter(tenant=tenant, created_at__gte=days.start, created_at__lt=days.end)
    if models:
        records = records.filter(model__in=list(models))
    if api_key_ids:
        records = records.filter(api_key_id__in=list(api_key_ids))
    # the day's index, computed by the database from the days' UTC starts (no per-row conversion)
    index = Case(*[When(created_at__lt=start, then=Value(i - 1)) for i, start in enumerate(days.starts[1:], 1)],
                 default=Value(len(days.days) - 1), output_field=IntegerField())
    return records.annotate(day_index=index).order_by()


def latency_by_day(*, tenant: Tenant, days: Days, models=(), api_key_ids=()) -> dict[date, dict]:
    """Local day -> requests, errors, error_rate, ttft_p50_s, ttft_p95_s (None without a first token)."""
    out = {day: {"requests": 0, "errors": 0, "error_rate": 0.0, "ttft_p50_s": None, "ttft_p95_s": None}
           for day in days.days}
    records = _records(tenant, days, models, api_key_ids)
    aggregates = {"requests": Count("id"), "errors": Count("id", filter=Q(finish_reason="error"))}
    postgres = connection.vendor == "postgresql"
    if postgres:
        aggregates["ttft_p50_s"] = PercentileCont("ttft_s", 0.5)
        aggregates["ttft_p95_s"] = PercentileCont("ttft_s", 0.95)
    for row in records.values("day_index").annotate(**aggregates):
        figures = out[days.days[row.pop("day_index")]]
        figures.update(row)
    if not postgres:
        values: dict[int, list[float]] = {}
        for index, ttft in records.filter(ttft_s__isnull=False).values_list("day_index", "ttft_s"):
            values.setdefault(index, []).append(ttft)
        for index, samples in values.items():
            samples.sort()
            figures = out[days.days[index]]
            figures["ttft_p50_s"] = percentile_cont(samples, 0.5)
            figures["ttft_p95_s"] = percentile_cont(samples, 0.95)
    for figures in out.values():
        figures["error_rate"] = figures["errors"] / figures["requests"] if figures["requests"] else 0.0
        for name in ("ttft_p50_s", "ttft_p95_s"):
            if figures[name] is not None:
                figures[name] = round(float(figures[name]), 4)
    return out


def usage_totals(by_day: dict[date, dict[str, int]]) -> dict[str, int]:
    total = _empty()
    for sums in by_day.values():
        _add_into(total, sums)
    return total


def models_used(*, tenant: Tenant) -> list[str]:
    """The models in the tenant's records (for the usage page's filter)."""
    from billing.models import DailyUsage

    return sorted(set(DailyUsage.objects.filter(tenant=tenant).values_list("model", flat=True).distinct())
                  | set(UsageRecord.objects.filter(tenant=tenant).order_by("-created_at")
                        .values_list("model", flat=True)[:200]))
