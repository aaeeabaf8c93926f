"""Months in a tenant's time zone, as UTC instants, across DST changes."""

from datetime import datetime, timedelta, timezone

import pytest
from django.core.exceptions import ValidationError

from billing.periods import month_containing, month_parse, month_period, period_after

UTC = timezone.utc


def test_los_angeles_march_holds_the_spring_forward():
    march = month_period(year=2026, month=3, tz="America/Los_Angeles")
    assert march.start == datetime(2026, 3, 1, 8, tzinfo=UTC)  # PST, UTC-8
    assert march.end == datetime(2026, 4, 1, 7, tzinfo=UTC)  # PDT, UTC-7 (DST began 2026-03-08)
    assert march.end - march.start == timedelta(days=31) - timedelta(hours=1)


def test_los_angeles_november_holds_the_fall_back():
    november = month_period(year=2026, month=11, tz="America/Los_Angeles")
    assert (november.start, november.end) == (datetime(2026, 11, 1, 7, tzinfo=UTC), datetime(2026, 12, 1, 8, tzinfo=UTC))
    assert november.end - november.start == timedelta(days=30, hours=1)


def test_the_instant_of_local_midnight_belongs_to_the_new_month():
    # 2026-04-01 00:00 in Los Angeles is 07:00 UTC: a UTC view would still say "March" until 07:00
    assert month_containing(instant=datetime(2026, 4, 1, 6, 59, 59, tzinfo=UTC), tz="America/Los_Angeles").label == "2026-03"
    assert month_containing(instant=datetime(2026, 4, 1, 7, tzinfo=UTC), tz="America/Los_Angeles").label == "2026-04"
    # and on the UTC evening of the 31st it is already April in Kolkata (UTC+5:30, no DST)
    assert month_containing(instant=datetime(2026, 3, 31, 18, 30, tzinfo=UTC), tz="Asia/Kolkata").label == "2026-04"
    assert month_containing(instant=datetime(2026, 3, 31, 18, 29, 59, tzinfo=UTC), tz="Asia/Kolkata").label == "2026-03"


def test_kolkata_months_start_at_half_past_six_the_evening_before_in_utc():
    january = month_period(year=2026, month=1, tz="Asia/Kolkata")
    assert january.start == datetime(2025, 12, 31, 18, 30, tzinfo=UTC)
    assert january.end == datetime(2026, 1, 31, 18, 30, tzinfo=UTC)
    assert period_after(january).start == january.end and period_after(january).label == "2026-02"


def test_consecutive_months_tile_the_year_in_every_zone():
    for tz in ("UTC", "America/Los_Angeles", "Asia/Kolkata", "Europe/London", "Australia/Sydney"):
        period = month_parse(label="2026-01", tz=tz)
        total = timedelta()
        for _ in range(12):
            following = period_after(period)
            assert following.start == period.end
            total += period.end - period.start
            period = following
        assert total == timedelta(days=365), tz


def test_bad_input():
    with pytest.raises(ValueError):
        month_parse(label="2026-13", tz="UTC")
    with pytest.raises(ValueError):
        month_containing(instant=datetime(2026, 1, 1), tz="UTC")


@pytest.mark.django_db
def test_tenant_timezone_is_validated(tenant_factory):
    tenant = tenant_factory()
    assert tenant.timezone == "UTC"
    tenant.timezone = "Mars/Olympus_Mons"
    with pytest.raises(ValidationError):
        tenant.full_clean()
    tenant.timezone = "Asia/Kolkata"
    tenant.full_clean()
    assert tenant.zone.key == "Asia/Kolkata"
