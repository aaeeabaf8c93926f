"""Hourly usage rollups: filled from the usage records, idempotent, crash-safe, late records folded in.

After Zulip's analytics/lib/counts.py: a FillState row says how far the
rollup is filled; a run fills every complete hour since, replacing each hour's
rows as a whole from the records, then each touched day's rows from its hours
(so refilling is idempotent, and a rebuild equals what it replaced), and the
exact TTFT percentiles of each tenant's closed local days it touched
(billing.services.latency_rollups: percentiles cannot be summed from hours). A run is one transaction holding the FillState row
lock: a crash rolls it back whole and the next run redoes it; two runs never
interleave.

The sums are the ledger's (billing.ledger.SUMS), the hour and day floors billing.periods'.

Late records: a record can commit after its hour was filled (its transaction
began before the hour ended), or be written with an old `created_at`. Each
run refills the last LOOKBACK before the filled end, and every older hour
holding a record whose id is above the last run's high-water mark.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Max
from django.db.models.functions import TruncHour
from django.utils import timezone

from billing.ledger import FIGURES, IS_BATCH, ROLLUP, SUMS, figure_sum, rolled_up_until
from billing.models import DailyUsage, FillState, HourlyUsage, UsageRecord
from billing.periods import HOUR, UTC, day_floor, hour_floor
from billing.services.latency_rollups import daily_latency_refill

DAY = timedelta(days=1)
LOOKBACK = timedelta(hours=1)
CHUNK = timedelta(days=7)  # hours aggregated per query on a long backfill
DIMENSIONS = ("tenant_id", "api_key_id", "model", "tier", "batch")


@dataclass(frozen=True, slots=True)
class FillResult:
    start: datetime | None  # the earliest hour (re)filled, None when nothing was
    end: datetime
    late_hours: int
    rows: int


def hourly_rows(*, start: datetime, end: datetime) -> list[HourlyUsage]:
    """The rollup rows of the hours in [start, end), computed from the records (not saved)."""
    grouped = (
        UsageRecord.objects.filter(created_at__gte=start, created_at__lt=end)
        .annotate(bucket=TruncHour("created_at", tzinfo=UTC), batch=IS_BATCH)
        .order_by()
        .values("bucket", *DIMENSIONS)
        .annotate(**SUMS)
    )
    return [HourlyUsage(hour=row.pop("bucket"), **row) for row in grouped]


def _refill(start: datetime, end: datetime, closed_until: datetime) -> int:
    """Replace the hours in [start, end) from the records, then the days they fall in from their hours, then
    the latency figures of the tenants' local days overlapping them that end by `closed_until`."""
    HourlyUsage.objects.filter(hour__gte=start, hour__lt=end).delete()
    total = 0
    cursor = start
    while cursor < end:
        upto = min(cursor + CHUNK, end)
        rows = hourly_rows(start=cursor, end=upto)
        HourlyUsage.objects.bulk_create(rows, batch_size=2000)
        total += len(rows)
        cursor = upto
    day = day_floor(start)
    while day < end:
        _refill_day(day)
        day += DAY
    daily_latency_refill(start=start, end=end, closed_until=closed_until)
    return total


def _refill_day(day: datetime) -> None:
    DailyUsage.objects.filter(day=day).delete()
    grouped = (HourlyUsage.objects.filter(hour__gte=day, hour__lt=day + DAY).order_by()
               .values(*DIMENSIONS).annotate(**{name: figure_sum(name) for name in FIGURES}))
    DailyUsage.objects.bulk_create([DailyUsage(day=day, **row) for row in grouped], batch_size=2000)


def _runs(hours: list[datetime]) -> list[tuple[datetime, datetime]]:
    """Sorted hours as [start, end) ranges of consecutive hours (one refill per range)."""
    runs: list[tuple[datetime, datetime]] = []
    for hour in hours:
        if runs and runs[-1][1] == hour:
            runs[-1] = (runs[-1][0], hour + HOUR)
        else:
            runs.append((hour, hour + HOUR))
    return runs


@transaction.atomic
def hourly_usage_fill(*, now: datetime | None = None) -> FillResult:
    """Fill every complete hour up to `now` (default: the clock), refilling late ones."""
    target = hour_floor(now or timezone.now())
    high_water = UsageRecord.objects.aggregate(top=Max("id"))["top"] or 0
    state = FillState.objects.select_for_update().filter(name=ROLLUP).first()
    if state is None:
        first = UsageRecord.objects.order_by("created_at").values_list("created_at", flat=True).first()
        state = FillState(name=ROLLUP, end=hour_floor(first) if first else target)
        late: set[datetime] = set()
        start = state.end
    else:
        start = min(state.end - LOOKBACK, target)
        late = {
            hour_floor(created)
            for created in UsageRecord.objects.filter(id__gt=state.last_record_id, created_at__lt=start)
            .values_list("created_at", flat=True)
        }
    closed_until = max(state.end, target)
    rows = sum(_refill(first, end, closed_until) for first, end in _runs(sorted(late)))
    if start < target:
        rows += _refill(start, target, closed_until)
    state.end = max(state.end, target)
    state.last_record_id = max(state.last_record_id, high_water)
    state.save()
    earliest = min([*late, start]) if (late or start < target) else None
    return FillResult(start=earliest, end=state.end, late_hours=len(late), rows=rows)


@transaction.atomic
def hourly_usage_rebuild(*, start: datetime, end: datetime) -> int:
    """Recompute the hours in [start, end) (and their days) from the records; returns the hour rows written."""
    return _refill(hour_floor(start), hour_floor(end), rolled_up_until() or hour_floor(end))
