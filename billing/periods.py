"""Billing periods: calendar months and local days in a tenant's time zone, as aware UTC instants, and
the UTC floors of the rollups' hours and days (the one definition of each period helper).

A month starts at local midnight on its first day. The boundaries are
computed from local wall-clock dates and converted once, so a month that
contains a DST change is simply an hour shorter or longer; nothing adds
fixed 24-hour days. (Local midnight itself is never skipped or doubled in the
zones that change at 02:00; where a zone did jump over midnight, zoneinfo's
fold=0 picks the earlier reading, and the boundary is still one instant
shared by both months.)

Which month a request belongs to (the one rule): the month, in the tenant's
zone, of its usage record's `created_at`, i.e. when the request ended. Invoices,
the usage pages and the rebuilt quota and budget counters all read
`created_at`. Admission has to reserve before the end is known, so it reserves
on the month the request is admitted in; a request still running when that
month ends (admitted at 23:59:59.9, finished after midnight) gives that
reservation back whole when it settles and is counted in the next month's
counters instead (billing.counters.base, `Actual.at`), so each month's
counter equals the month its invoice bills. (A request lives at most
ADMISSION_HOLD_S, so it crosses one boundary at most.) Its price is still the
one in force when it was admitted (`admitted_at`).
"""

from __future__ import annotations

import zoneinfo
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from datetime import timezone as dt_timezone

UTC = dt_timezone.utc
HOUR = timedelta(hours=1)


@dataclass(frozen=True, slots=True)
class Period:
    """[start, end) in UTC; `month` is its first local day (YYYY-MM-01)."""

    month: date
    start: datetime
    end: datetime
    tz: str

    @property
    def label(self) -> str:
        return f"{self.month:%Y-%m}"

    def contains(self, instant: datetime) -> bool:
        return self.start <= instant < self.end


def local_midnight(day: date, zone: zoneinfo.ZoneInfo) -> datetime:
    """The UTC instant of local midnight starting `day` in `zone`."""
    return datetime(day.year, day.month, day.day, tzinfo=zone).astimezone(UTC)


def hour_floor(instant: datetime) -> datetime:
    """The UTC hour holding the aware `instant` (an hourly rollup's bucket)."""
    return instant.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def day_floor(instant: datetime) -> datetime:
    """The UTC day holding the aware `instant` (a daily rollup's bucket)."""
    return hour_floor(instant).replace(hour=0)


def _next_month(day: date) -> date:
    return date(day.year + (day.month == 12), day.month % 12 + 1, 1)


def month_period(*, year: int, month: int, tz: str) -> Period:
    zone = zoneinfo.ZoneInfo(tz)
    first = date(year, month, 1)
    return Period(month=first, start=local_midnight(first, zone),
                  end=local_midnight(_next_month(first), zone), tz=tz)


def month_containing(*, instant: datetime, tz: str) -> Period:
    """The month (in `tz`) that holds the aware `instant`."""
    if instant.tzinfo is None:
        raise ValueError("an aware datetime is required")
    local = instant.astimezone(zoneinfo.ZoneInfo(tz))
    return month_period(year=local.year, month=local.month, tz=tz)


def month_parse(*, label: str, tz: str) -> Period:
    """"YYYY-MM" -> that month in `tz`."""
    try:
        year, month = (int(part) for part in label.split("-"))
        return month_period(year=year, month=month, tz=tz)
    except ValueError as exc:
        raise ValueError(f"a period is YYYY-MM, not {label!r}") from exc


def period_after(period: Period) -> Period:
    return month_containing(instant=period.end, tz=period.tz)


@dataclass(frozen=True, slots=True)
class Days:
    """The local days first..last of zone `tz`: [start, end) in UTC and each day's start.

    A local day starts at local midnight (a DST day is 23 or 25 hours). Where a zone's midnight is not on a
    whole UTC hour (India, Nepal, ...), the UTC hour holding it is split between two days: the figures of
    such an hour are read per minute from the records, never apportioned (billing.selectors.usage).
    """

    tz: str
    days: tuple[date, ...]
    starts: tuple[datetime, ...]  # UTC instant of each day's local midnight
    end: datetime  # local midnight after the last day

    @property
    def start(self) -> datetime:
        return self.starts[0]

    @property
    def whole_hours(self) -> bool:
        """Every local midnight in the range is on a whole UTC hour (the hourly rollups split the days)."""
        return all(instant.minute == 0 and instant.second == 0 for instant in (*self.starts, self.end))

    @property
    def utc_days(self) -> bool:
        """Every local midnight is a UTC midnight (the daily rollups are the days)."""
        return self.whole_hours and all(instant.hour == 0 for instant in (*self.starts, self.end))

    def day_of(self, instant: datetime) -> date | None:
        """The local day holding `instant`, or None outside the range."""
        if instant < self.start or instant >= self.end:
            return None
        local = instant.astimezone(zoneinfo.ZoneInfo(self.tz)).date()
        return local if self.days[0] <= local <= self.days[-1] else None

    def split_hours(self) -> list[datetime]:
        """UTC hours that hold a local midnight strictly inside them."""
        return sorted({hour_floor(instant) for instant in (*self.starts, self.end) if instant != hour_floor(instant)})


def days_between(*, first: date, last: date, tz: str) -> Days:
    if last < first:
        raise ValueError("the range ends before it starts")
    zone = zoneinfo.ZoneInfo(tz)
    count = (last - first).days + 1
    days = tuple(first + timedelta(days=i) for i in range(count))
    return Days(tz=tz, days=days, starts=tuple(local_midnight(day, zone) for day in days),
                end=local_midnight(last + timedelta(days=1), zone))


def today_in(tz: str, now: datetime | None = None) -> date:
    return (now or datetime.now(UTC)).astimezone(zoneinfo.ZoneInfo(tz)).date()
