"""Local calendar days of a tenant as UTC instants, and how its days fall on the UTC hours of the rollups.

A local day starts at local midnight (zoneinfo; a DST day is 23 or 25 hours).
Where a zone's midnight is not on a whole UTC hour (India, Nepal, ...), the
UTC hour holding it is split between two days: the figures of such an hour
are read per minute from the records, never apportioned.
"""

from __future__ import annotations

import zoneinfo
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from datetime import timezone as dt_timezone

UTC = dt_timezone.utc
HOUR = timedelta(hours=1)


@dataclass(frozen=True, slots=True)
class Days:
    """The local days first..last of zone `tz`: [start, end) in UTC and each day's start."""

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


def hour_floor(instant: datetime) -> datetime:
    return instant.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def local_midnight(day: date, zone: zoneinfo.ZoneInfo) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=zone).astimezone(UTC)


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
