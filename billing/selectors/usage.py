"""A tenant's usage per local day (tokens by kind, requests, spend; time to first token and errors), the
models it used, and its period's usage as admission counts it: the dashboard's reads of the ledger.

Token and cost figures go through billing.usage_buckets (whole days or hours from the rollups, the part the
rollup has not reached from the records), so they are the ledger's integers (billing.ledger.SUMS). A day is
a local day of the tenant (billing.periods.Days); usage_by_day_and_model and models_in read the same buckets
grouped by model (the dashboard's model filter and breakdown). TTFT percentiles and errors of closed days are
stored by billing's hourly rollup (billing.services.latency_rollups), the open day's computed from the records with
the same percentile_cont definition.
"""

from __future__ import annotations

from datetime import date, timedelta

from billing.counters.base import QUOTA, SPEND
from billing.ledger import FIGURES, batch_filter, ledger_totals
from billing.models import DailyUsage, UsageRecord
from billing.periods import HOUR, Days, Period, hour_floor
from billing.services.latency_rollups import latency_of_days, stored_latency
from billing.usage_buckets import Query, usage_sums
from tenants.models import Tenant
from tenants.services.limits import LimitScope


def _empty() -> dict[str, int]:
    return dict.fromkeys(FIGURES, 0)


def _add_into(target: dict[str, int], sums: dict[str, int]) -> None:
    for name in FIGURES:
        target[name] += sums[name]


def _sums(tenant: Tenant, start, end, width: str, models, api_key_ids, group_by=(), figures=FIGURES, batch=None):
    return usage_sums(Query(tenant=tenant, start=start, end=end, width=width, models=tuple(models),
                            api_key_ids=tuple(api_key_ids), group_by=group_by, figures=figures, batch=batch))


def _day_buckets(tenant: Tenant, days: Days, models, api_key_ids, group_by=(), figures=FIGURES, batch=None):
    """UTC bucket -> group -> sums covering exactly the local days: day buckets where local days are UTC
    days, else hours, and per minute the UTC hours two local days share. `batch`: only Batch API lines
    (True), only live requests (False), or both (None)."""
    if days.utc_days:
        return _sums(tenant, days.start, days.end, "1d", models, api_key_ids, group_by, figures, batch)
    end = hour_floor(days.end) + (HOUR if days.end != hour_floor(days.end) else timedelta(0))
    buckets = dict(_sums(tenant, hour_floor(days.start), end, "1h", models, api_key_ids, group_by, figures, batch))
    for hour in days.split_hours():  # the hours two local days share: per minute, from the records
        buckets.pop(hour, None)
        buckets.update(_sums(tenant, hour, hour + HOUR, "1m", models, api_key_ids, group_by, figures, batch))
    return buckets


def usage_by_day(*, tenant: Tenant, days: Days, models=(), api_key_ids=(),
                 batch: bool | None = None) -> dict[date, dict[str, int]]:
    """Local day -> billing's FIGURES (requests, tokens by kind, costs in femto-USD), every day present."""
    out = {day: _empty() for day in days.days}
    for bucket, groups in _day_buckets(tenant, days, models, api_key_ids, batch=batch).items():
        day = days.day_of(bucket)
        if day is not None:
            for sums in groups.values():
                _add_into(out[day], sums)
    return out


def usage_by_day_and_model(*, tenant: Tenant, days: Days, models=(), api_key_ids=(),
                           batch: bool | None = None) -> dict[date, dict[str, dict[str, int]]]:
    """Local day -> model -> FIGURES, every day present (a day maps only the models it has figures for).
    The same buckets as usage_by_day, grouped by model: summed over the models, a day is usage_by_day's."""
    out: dict[date, dict[str, dict[str, int]]] = {day: {} for day in days.days}
    for bucket, groups in _day_buckets(tenant, days, models, api_key_ids, group_by=("model",), batch=batch).items():
        day = days.day_of(bucket)
        if day is not None:
            for (model,), sums in groups.items():
                _add_into(out[day].setdefault(model, _empty()), sums)
    return out


def models_in(*, tenant: Tenant, days: Days) -> list[str]:
    """The models the tenant has usage of in the local days (rollups and records, as the figures), sorted."""
    buckets = _day_buckets(tenant, days, (), (), group_by=("model",), figures=("requests",))
    return sorted({model for bucket, groups in buckets.items() if days.day_of(bucket) is not None
                   for (model,), sums in groups.items() if sums["requests"]})


def usage_totals(by_day: dict[date, dict[str, int]]) -> dict[str, int]:
    total = _empty()
    for sums in by_day.values():
        _add_into(total, sums)
    return total


def latency_by_day(*, tenant: Tenant, days: Days, models=(), api_key_ids=(),
                   batch: bool | None = None) -> dict[date, dict]:
    """Local day -> requests, errors, error_rate, ttft_p50_s, ttft_p95_s (None without a first token).

    Unfiltered, the closed days the hourly rollup has reached read their stored figures (exact, built
    from their records); the rest (the open day, days not yet built, any model or key filter) are
    computed from the records with the same definition (billing.services.latency_rollups). `batch`: only
    Batch API lines (True) or only live requests (False).
    """
    stored = {} if (models or api_key_ids or batch is not None) else stored_latency(tenant=tenant, tz=days.tz, days=days.days)
    ends = (*days.starts[1:], days.end)
    spans = [(day, start, end) for day, start, end in zip(days.days, days.starts, ends) if day not in stored]
    records = UsageRecord.objects.filter(tenant=tenant)
    if models:
        records = records.filter(model__in=list(models))
    if api_key_ids:
        records = records.filter(api_key_id__in=list(api_key_ids))
    if batch is not None:
        records = records.filter(batch_filter(batch))
    out = {**stored, **latency_of_days(records, tz=days.tz, spans=spans)}
    out = {day: out[day] for day in days.days}
    for figures in out.values():
        figures["error_rate"] = figures["errors"] / figures["requests"] if figures["requests"] else 0.0
        for name in ("ttft_p50_s", "ttft_p95_s"):
            if figures[name] is not None:
                figures[name] = round(float(figures[name]), 4)
    return out


def tenant_models(*, tenant: Tenant) -> list[str]:
    """The models in the tenant's daily rollups and its latest 200 records, sorted."""
    return sorted(set(DailyUsage.objects.filter(tenant=tenant).order_by().values_list("model", flat=True).distinct())
                  | set(UsageRecord.objects.filter(tenant=tenant).order_by("-created_at")
                        .values_list("model", flat=True)[:200]))


def admission_used(*, tenant: Tenant, period: Period) -> tuple[int, int]:
    """(tokens, nano-USD) of the tenant's period as admission counts them (billing.ledger.ledger_totals)."""
    used = ledger_totals(scope=LimitScope.tenant(tenant.pk), start=period.start, end=period.end)
    return used[QUOTA], used[SPEND]
