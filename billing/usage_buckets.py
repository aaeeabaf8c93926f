"""Usage and cost figures in UTC time buckets, for the OpenAI-compatible APIs (selectors).

Whole hours already rolled up are read from HourlyUsage; whatever the rollup
has not reached yet (after its FillState end, or every minute bucket) is
summed from the usage records. Both hold the same integers, so the figures
equal the records' sums whatever the bucket width or grouping: the sums are
the ledger's (billing.ledger.SUMS) and the floors billing.periods'. (A record
written late into an hour already rolled up shows once the next rollup run,
at most its beat interval later, has folded it in.)
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import F
from django.db.models.functions import TruncDay, TruncHour, TruncMinute

from billing.ledger import FIGURES, IS_BATCH, SUMS, batch_filter, figure_sum, rolled_up_until
from billing.models import DailyUsage, HourlyUsage, UsageRecord
from billing.periods import UTC, day_floor, hour_floor
from tenants.models import Tenant

WIDTHS = {"1m": timedelta(minutes=1), "1h": timedelta(hours=1), "1d": timedelta(days=1)}
_TRUNC = {"1m": TruncMinute, "1h": TruncHour, "1d": TruncDay}
# group_by name -> (rollup field, record field)
DIMENSIONS = {"model": ("model", "model"), "api_key_id": ("api_key_id", "api_key_id"),
              "service_tier": ("tier", "tier"), "tenant_id": ("tenant_id", "tenant_id"),
              "batch": ("batch", "batch")}  # a record's `batch` is billing.ledger.IS_BATCH, annotated


def bucket_floor(instant: datetime, width: str) -> datetime:
    if width == "1m":
        return instant.astimezone(UTC).replace(second=0, microsecond=0)
    return hour_floor(instant) if width == "1h" else day_floor(instant)


@dataclass(frozen=True, slots=True)
class Query:
    tenant: Tenant | None  # None: every tenant's (the operator console)
    start: datetime  # the first bucket's start (aligned)
    end: datetime  # exclusive, aligned to the last bucket's end (or any instant after the last bucket's start)
    width: str
    group_by: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    api_key_ids: tuple[int, ...] = ()
    figures: tuple[str, ...] = FIGURES  # which of the ledger's sums
    batch: bool | None = None  # only Batch API lines (True), only live requests (False), or both (None)


def _filtered(queryset, query: Query, fields: dict[str, str], records: bool = False):
    if query.batch is not None:
        queryset = queryset.filter(batch_filter(query.batch)) if records else queryset.filter(batch=query.batch)
    if query.tenant is not None:
        queryset = queryset.filter(tenant=query.tenant)
    if query.models:
        queryset = queryset.filter(**{f"{fields['model']}__in": query.models})
    if query.api_key_ids:
        queryset = queryset.filter(**{f"{fields['api_key_id']}__in": query.api_key_ids})
    return queryset


def _rollup_rows(model, field: str, lower: datetime, upper: datetime, query: Query, trunc=None):
    fields = {name: pair[0] for name, pair in DIMENSIONS.items()}
    rows = _filtered(model.objects.filter(**{f"{field}__gte": lower, f"{field}__lt": upper}), query, fields)
    bucket = trunc(field, tzinfo=UTC) if trunc else F(field)
    return (rows.annotate(bucket=bucket).order_by().values("bucket", *(fields[g] for g in query.group_by))
            .annotate(**{name: figure_sum(name) for name in query.figures})), fields


def usage_sums(query: Query) -> dict[datetime, dict[tuple, dict[str, int]]]:
    """bucket start -> group key (values of query.group_by) -> the query's figures' sums.

    Day buckets read whole days from DailyUsage, the filled hours of the day
    the rollup is in from HourlyUsage; hour buckets read HourlyUsage; the
    rest (and every minute bucket) comes from the records.
    """
    out: dict[datetime, dict[tuple, dict[str, int]]] = defaultdict(
        lambda: defaultdict(lambda: dict.fromkeys(query.figures, 0)))
    split = query.start
    if query.width != "1m":
        filled = rolled_up_until()
        split = min(max(filled, query.start), query.end) if filled else query.start
        hours_from = query.start
        if query.width == "1d":
            hours_from = max(min(bucket_floor(split, "1d"), split), query.start)
            if hours_from > query.start:
                _add(out, *_rollup_rows(DailyUsage, "day", query.start, hours_from, query), query)
        if split > hours_from:
            trunc = TruncDay if query.width == "1d" else None
            _add(out, *_rollup_rows(HourlyUsage, "hour", hours_from, split, query, trunc), query)
    if split < query.end:
        fields = {name: pair[1] for name, pair in DIMENSIONS.items()}
        records = UsageRecord.objects.filter(created_at__gte=split, created_at__lt=query.end)
        if "batch" in query.group_by:
            records = records.annotate(batch=IS_BATCH)
        rows = (_filtered(records, query, fields, records=True)
                .annotate(bucket=_TRUNC[query.width]("created_at", tzinfo=UTC)).order_by()
                .values("bucket", *(fields[g] for g in query.group_by))
                .annotate(**{name: SUMS[name] for name in query.figures}))
        _add(out, rows, fields, query)
    return out


def _add(out, rows: Iterable[dict], fields: dict[str, str], query: Query) -> None:
    for row in rows:
        bucket = row["bucket"].astimezone(UTC)
        sums = out[bucket][tuple(row[fields[g]] for g in query.group_by)]
        for name in query.figures:
            sums[name] += int(row[name] or 0)
