"""Usage and cost figures in UTC time buckets, for the OpenAI-compatible APIs (selectors).

Whole hours already rolled up are read from HourlyUsage; whatever the rollup
has not reached yet (after its FillState end, or every minute bucket) is
summed from the usage records. Both hold the same integers, so the figures
equal the records' sums whatever the bucket width or grouping. (A record
written late into an hour already rolled up shows once the next rollup run,
at most its beat interval later, has folded it in.)
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone

from django.db.models import F
from django.db.models.functions import TruncDay, TruncHour, TruncMinute

from billing.models import DailyUsage, FillState, HourlyUsage, UsageRecord
from billing.services.rollups import ROLLUP, SUMS, figure_sum
from tenants.models import Tenant

UTC = dt_timezone.utc
WIDTHS = {"1m": timedelta(minutes=1), "1h": timedelta(hours=1), "1d": timedelta(days=1)}
_TRUNC = {"1m": TruncMinute, "1h": TruncHour, "1d": TruncDay}
# group_by name -> (rollup field, record field)
DIMENSIONS = {"model": ("model", "model"), "api_key_id": ("api_key_id", "api_key_id"),
              "service_tier": ("tier", "tier")}
FIGURES = ("requests", "input_tokens", "cached_input_tokens", "output_tokens", "input_cost_femtos",
           "cached_input_cost_femtos", "output_cost_femtos", "cost_femtos")
_RECORD_SUMS = {name: SUMS[name] for name in FIGURES}  # the rollup's own sums of the records (exact money sums)


def bucket_floor(instant: datetime, width: str) -> datetime:
    instant = instant.astimezone(UTC)
    if width == "1m":
        return instant.replace(second=0, microsecond=0)
    if width == "1h":
        return instant.replace(minute=0, second=0, microsecond=0)
    return instant.replace(hour=0, minute=0, second=0, microsecond=0)


@dataclass(frozen=True, slots=True)
class Query:
    tenant: Tenant
    start: datetime  # the first bucket's start (aligned)
    end: datetime  # exclusive, aligned to the last bucket's end
    width: str
    group_by: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    api_key_ids: tuple[int, ...] = ()


def _filtered(queryset, query: Query, fields: dict[str, str]):
    queryset = queryset.filter(tenant=query.tenant)
    if query.models:
        queryset = queryset.filter(**{f"{fields['model']}__in": query.models})
    if query.api_key_ids:
        queryset = queryset.filter(**{f"{fields['api_key_id']}__in": query.api_key_ids})
    return queryset


def _rolled_up_until() -> datetime | None:
    return FillState.objects.filter(name=ROLLUP).values_list("end", flat=True).first()


def _rollup_rows(model, field: str, lower: datetime, upper: datetime, query: Query, trunc=None):
    fields = {name: pair[0] for name, pair in DIMENSIONS.items()}
    rows = _filtered(model.objects.filter(**{f"{field}__gte": lower, f"{field}__lt": upper}), query, fields)
    bucket = trunc(field, tzinfo=UTC) if trunc else F(field)
    return (rows.annotate(bucket=bucket).order_by().values("bucket", *(fields[g] for g in query.group_by))
            .annotate(**{name: figure_sum(name) for name in FIGURES})), fields


def usage_sums(query: Query) -> dict[datetime, dict[tuple, dict[str, int]]]:
    """bucket start -> group key (values of query.group_by) -> FIGURES sums.

    Day buckets read whole days from DailyUsage, the filled hours of the day
    the rollup is in from HourlyUsage; hour buckets read HourlyUsage; the
    rest (and every minute bucket) comes from the records.
    """
    out: dict[datetime, dict[tuple, dict[str, int]]] = defaultdict(lambda: defaultdict(lambda: dict.fromkeys(FIGURES, 0)))
    split = query.start
    if query.width != "1m":
        filled = _rolled_up_until()
        split = min(max(filled, query.start), query.end) if filled else query.start
        hours_from = query.start
        if query.width == "1d":
            hours_from = max(min(bucket_floor(split, "1d"), split), query.start)
            if hours_from > query.start:
                _add(out, *_rollup_rows(DailyUsage, "day", query.start, hours_from, query), query.group_by)
        if split > hours_from:
            trunc = TruncDay if query.width == "1d" else None
            _add(out, *_rollup_rows(HourlyUsage, "hour", hours_from, split, query, trunc), query.group_by)
    if split < query.end:
        fields = {name: pair[1] for name, pair in DIMENSIONS.items()}
        rows = (_filtered(UsageRecord.objects.filter(created_at__gte=split, created_at__lt=query.end), query, fields)
                .annotate(bucket=_TRUNC[query.width]("created_at", tzinfo=UTC)).order_by()
                .values("bucket", *(fields[g] for g in query.group_by))
                .annotate(**_RECORD_SUMS))
        _add(out, rows, fields, query.group_by)
    return out


def _add(out, rows: Iterable[dict], fields: dict[str, str], group_by: tuple[str, ...]) -> None:
    for row in rows:
        bucket = row["bucket"].astimezone(UTC)
        sums = out[bucket][tuple(row[fields[g]] for g in group_by)]
        for name in FIGURES:
            sums[name] += int(row[name] or 0)
