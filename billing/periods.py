"""Billing periods: calendar months in a tenant's time zone, as aware UTC instants.

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
counters instead (billing.admission.base, `Actual.at`), so each month's
counter equals the month its invoice bills. (A request lives at most
ADMISSION_HOLD_S, so it crosses one boundary at most.) Its price is still the
one in force when it was admitted (`admitted_at`).
"""

from __future__ import annotations

import zoneinfo
from dataclasses import dataclass
from datetime import date, datetime
from datetime import timezone as dt_timezone


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


def _local_midnight_utc(day: date, zone: zoneinfo.ZoneInfo) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=zone).astimezone(dt_timezone.utc)


def _next_month(day: date) -> date:
    return date(day.year + (day.month == 12), day.month % 12 + 1, 1)


def month_period(*, year: int, month: int, tz: str) -> Period:
    zone = zoneinfo.ZoneInfo(tz)
    first = date(year, month, 1)
    return Period(month=first, start=_local_midnight_utc(first, zone),
                  end=_local_midnight_utc(_next_month(first), zone), tz=tz)


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
