"""Revenue in the operator console needs `dashboard.view_revenue`: other staff see the fleet, not the money."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone

import pytest
import time_machine
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client

from billing.models import UsageRecord
from billing.money import usd_str

REVENUE_KEYS = {"revenue_today_usd", "revenue_month_usd", "top_tenants"}


def _client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def spend(tenant_factory, seed_usage):
    """A tenant with usage earlier today: the month's revenue, as the console's JSON writes it."""
    now = datetime(2026, 4, 10, 15, 20, tzinfo=dt_timezone.utc)
    tenant = tenant_factory(slug="big-spender-co")
    seed_usage(tenant, start=now - timedelta(hours=3), hours=2, per_hour=5)
    total = sum(UsageRecord.objects.filter(tenant=tenant).values_list("cost_femtos", flat=True))
    assert total > 0
    with time_machine.travel(now, tick=True):
        yield tenant, usd_str(total)


def test_staff_without_the_permission_sees_no_revenue(db, spend):
    tenant, month_usd = spend
    staff = _client(get_user_model().objects.create_user("ops", password="x-long-password-1", is_staff=True))
    page = staff.get("/admin/console/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "Live workers" in html  # the rest of the console is there
    assert "Revenue" not in html and "Top tenants" not in html
    assert tenant.slug not in html and month_usd not in html  # not in the embedded JSON either
    summary = staff.get("/admin/console/summary.json").json()
    assert "workers" in summary and not REVENUE_KEYS & summary.keys()
    assert month_usd not in json.dumps(summary)


def test_the_permission_and_superusers_see_revenue(db, spend):
    tenant, month_usd = spend
    granted = get_user_model().objects.create_user("finance", password="x-long-password-1", is_staff=True)
    granted.user_permissions.add(Permission.objects.get(content_type__app_label="dashboard", codename="view_revenue"))
    root = get_user_model().objects.create_superuser("root", "r@example.com", "x-long-password-1")
    for user in (granted, root):
        client = _client(user)
        html = client.get("/admin/console/").content.decode()
        assert "Revenue this month" in html and "Top tenants by spend" in html
        summary = client.get("/admin/console/summary.json").json()
        assert summary["revenue_month_usd"] == month_usd
        assert [row["slug"] for row in summary["top_tenants"]] == [tenant.slug]
