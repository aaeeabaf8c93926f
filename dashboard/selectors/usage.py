"""A tenant's usage per local day: tokens by kind, requests, spend (from billing's rollups and records),
and time to first token and error rate (from the records).

Token and cost figures go through billing.usage_buckets (whole days or hours
from the rollups, the part the rollup has not reached from the records), so
they are the ledger's integers. A day is a local day of the tenant
(selectors.days); TTFT percentiles are percentile_cont (linear interpolation)
on PostgreSQL and the same formula in Python elsewhere.
"""

from __future__ import annotations

import zoneinfo
from datetime import date, timedelta

from django.db import connection
from django.db.models import Aggregate, Count, FloatField, Q
from django.db.models.functions import TruncDate

from billing.models import UsageRecord
from billing.usage_buckets import FIGURES, Query, usage_sums
from common.cache import TtlCache
from dashboard.selectors.days import HOUR, Days, hour_floor
from tenants.models import Tenant

MAX_RANGE_DAYS = 92  # the usage page's longest range
MODELS_USED_TTL_S = 60  # a new model shows in the filter within a minute


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


def _records(tenant: Tenant, start, end, models, api_key_ids):
    records = UsageRecord.objects.filter(tenant=tenant, created_at__gte=start, created_at__lt=end)
    if models:
        records = records.filter(model__in=list(models))
    if api_key_ids:
        records = records.filter(api_key_id__in=list(api_key_ids))
    return records.order_by()


def latency_by_day(*, tenant: Tenant, days: Days, models=(), api_key_ids=()) -> dict[date, dict]:
    """Local day -> requests, errors, error_rate, ttft_p50_s, ttft_p95_s (None without a first token).

    PostgreSQL groups by the local date (AT TIME ZONE) and computes percentile_cont itself; elsewhere
    each day is one range scan of the (tenant, created_at) index returning its TTFTs and outcomes
    (a CASE over the days' bounds costs a comparison per bound and row, far more on SQLite).
    """
    out = {day: {"requests": 0, "errors": 0, "error_rate": 0.0, "ttft_p50_s": None, "ttft_p95_s": None}
           for day in days.days}
    if connection.vendor == "postgresql":
        rows = (_records(tenant, days.start, days.end, models, api_key_ids)
                .annotate(day=TruncDate("created_at", tzinfo=zoneinfo.ZoneInfo(days.tz))).values("day")
                .annotate(requests=Count("id"), errors=Count("id", filter=Q(finish_reason="error")),
                          ttft_p50_s=PercentileCont("ttft_s", 0.5), ttft_p95_s=PercentileCont("ttft_s", 0.95)))
        for row in rows:
            if row["day"] in out:
                out[row.pop("day")].update(row)
    else:
        for day, start, end in zip(days.days, days.starts, (*days.starts[1:], days.end)):
            outcomes = list(_records(tenant, start, end, models, api_key_ids).values_list("ttft_s", "finish_reason"))
            ttfts = sorted(ttft for ttft, _reason in outcomes if ttft is not None)
            out[day].update(requests=len(outcomes), errors=sum(reason == "error" for _ttft, reason in outcomes),
                            ttft_p50_s=percentile_cont(ttfts, 0.5), ttft_p95_s=percentile_cont(ttfts, 0.95))
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


_models_used: TtlCache[int, list[str]] = TtlCache("models per tenant (dashboard filter)", ttl=MODELS_USED_TTL_S,
                                                  max_entries=10_000)


def models_used(*, tenant: Tenant) -> list[str]:
    """The models in the tenant's rollups and latest records (the usage page's filter), kept a minute."""
    from billing.models import DailyUsage

    def load() -> list[str]:
        return sorted(set(DailyUsage.objects.filter(tenant=tenant).order_by().values_list("model", flat=True)
                          .distinct())
                      | set(UsageRecord.objects.filter(tenant=tenant).order_by("-created_at")
                            .values_list("model", flat=True)[:200]))

    return _models_used.get_or_load(tenant.pk, load)
