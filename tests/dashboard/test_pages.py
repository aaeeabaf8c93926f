"""The dashboard's pages through Django's test client: roles, isolation (404), the key's secret once, CSV."""

from __future__ import annotations

import csv
import io
import json
import re
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone

import pytest
from django.test import Client
from django.urls import reverse

from billing.periods import month_containing
from billing.services.budgets import operator_budget_set, own_alert_percents, owner_budget_micros
from billing.services.invoices import invoice_draft_refresh
from tenants.models import ApiKey

UTC = dt_timezone.utc


def island(response, name: str):
    match = re.search(rf'<script id="{name}" type="application/json">(.*?)</script>', response.content.decode(), re.S)
    assert match, f"no data island {name}"
    return json.loads(match.group(1))


@pytest.fixture
def two_tenants(tenant_factory, member_factory, seed_usage):
    a, b = tenant_factory(slug="tenant-a"), tenant_factory(slug="tenant-b")
    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    seed_usage(a, start=now - timedelta(hours=30), hours=30)
    seed_usage(b, start=now - timedelta(hours=30), hours=30, seed=2)
    invoice_draft_refresh(tenant=b, period=month_containing(instant=now, tz=b.timezone))
    return a, b


def login(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_member_pages_render_with_islands(two_tenants, member_factory):
    a, _ = two_tenants
    client = login(member_factory(a, "member"))
    assert client.get("/dashboard/").url == reverse("dashboard:overview", args=[a.slug])
    overview = client.get(reverse("dashboard:overview", args=[a.slug]))
    assert overview.status_code == 200 and island(overview, "overview-data")["requests"] > 0
    usage = client.get(reverse("dashboard:usage", args=[a.slug]))
    data = island(usage, "usage-data")
    assert data["timezone"] == "UTC" and len(data["days"]) == 30
    specs = island(usage, "chart-specs")
    assert specs["chart-tokens"]["data"][0]["y"] == [row["input_tokens"] for row in data["days"]]
    rows = list(csv.reader(io.StringIO(client.get(reverse("dashboard:usage-csv", args=[a.slug])).content.decode())))
    assert rows[1][0] == "day" and [r[0] for r in rows[2:]] == [row["day"] for row in data["days"]]
    assert [r[5] for r in rows[2:]] == [row["spend_usd"] for row in data["days"]]
    for name in ("keys", "invoices", "settings"):
        assert client.get(reverse(f"dashboard:{name}", args=[a.slug])).status_code == 200


def test_other_tenants_pages_are_404(two_tenants, member_factory):
    a, b = two_tenants
    client = login(member_factory(a, "owner"))
    key_b = ApiKey.objects.create(tenant=b, name="b", prefix="sk-bbbbbbbbbb", last_four="bbbb", secret_hash="x")
    invoice_b = b.invoices.first()
    urls = [reverse(f"dashboard:{name}", args=[b.slug]) for name in ("overview", "usage", "usage-csv", "keys",
                                                                    "invoices", "settings")]
    urls += [reverse("dashboard:invoice", args=[b.slug, invoice_b.public_id]),
             reverse("invoice-html", args=[invoice_b.public_id]), reverse("invoice-csv", args=[invoice_b.public_id]),
             reverse("dashboard:invoice", args=[a.slug, invoice_b.public_id])]
    for url in urls:
        assert client.get(url).status_code == 404, url
    assert client.post(reverse("dashboard:key-revoke", args=[b.slug, key_b.public_id])).status_code == 404
    assert client.post(reverse("dashboard:key-revoke", args=[a.slug, key_b.public_id])).status_code == 404
    assert client.post(reverse("dashboard:keys", args=[b.slug]), {"name": "x"}).status_code == 404
    key_b.refresh_from_db()
    assert key_b.revoked_at is None and not ApiKey.objects.filter(name="x").exists()


def test_key_created_shown_once_then_revoked(tenant, member_factory):
    client = login(member_factory(tenant, "member"))
    url = reverse("dashboard:keys", args=[tenant.slug])
    response = client.post(url, {"name": "ci", "scopes": ["inference"], "requests_per_minute": "7"})
    secret = re.search(r'<code id="new-key-secret">(sk-[^<]+)</code>', response.content.decode()).group(1)
    key = ApiKey.objects.get(tenant=tenant, name="ci")
    assert key.scopes == ["inference"] and key.requests_per_minute == 7 and response["Cache-Control"] == "no-store"
    assert secret not in client.get(url).content.decode()
    client.post(reverse("dashboard:key-revoke", args=[tenant.slug, key.public_id]))
    key.refresh_from_db()
    assert key.revoked_at is not None


def test_viewer_reads_but_cannot_change(tenant, member_factory):
    client = login(member_factory(tenant, "viewer"))
    page = client.get(reverse("dashboard:keys", args=[tenant.slug])).content.decode()
    assert 'id="create-key"' not in page and 'id="read-only"' in page
    assert client.post(reverse("dashboard:keys", args=[tenant.slug]), {"name": "nope"}).status_code == 403
    assert client.post(reverse("dashboard:settings", args=[tenant.slug]), {"monthly_budget_usd": "5"}).status_code == 403
    assert not ApiKey.objects.filter(name="nope").exists()


def test_owner_sets_the_budget_member_cannot(tenant, member_factory):
    url = reverse("dashboard:settings", args=[tenant.slug])
    assert login(member_factory(tenant, "member")).post(url, {"monthly_budget_usd": "5"}).status_code == 403
    assert login(member_factory(tenant, "owner")).post(url, {"monthly_budget_usd": "12.5"}).status_code == 302
    tenant.refresh_from_db()
    assert owner_budget_micros(tenant=tenant) == 12_500_000  # the owners' own budget (the operator's cap is apart)


def test_owner_sets_the_budget_alerts_viewer_and_member_cannot(tenant, member_factory):
    url = reverse("dashboard:budget-alerts", args=[tenant.slug])
    for role in ("viewer", "member"):
        assert login(member_factory(tenant, role)).post(url, {"alert_percents": "10"}).status_code == 403
    owner = login(member_factory(tenant, "owner"))
    assert owner.post(url, {"alert_percents": "90, 25,90"}).status_code == 302
    tenant.refresh_from_db()
    assert own_alert_percents(tenant=tenant) == [25, 90]
    page = owner.get(reverse("dashboard:settings", args=[tenant.slug])).content.decode()
    assert "25, 90 (the tenant's own)" in page and 'value="25, 90"' in page
    assert owner.post(url, {"alert_percents": "0, 50"}).status_code == 200  # refused with the form's error
    assert owner.post(url, {"alert_percents": ""}).status_code == 302  # back to the platform's
    tenant.refresh_from_db()
    assert own_alert_percents(tenant=tenant) == []


def test_forms_refuse_without_csrf(tenant, member_factory):
    user = member_factory(tenant, "owner")
    client = Client(enforce_csrf_checks=True)
    assert client.post(reverse("login"), {"username": user.username, "password": "pw-dashboard-1-long"}).status_code == 403
    client.force_login(user)
    key = ApiKey.objects.create(tenant=tenant, name="k", prefix="sk-cccccccccc", last_four="cccc", secret_hash="x")
    for url, body in [(reverse("dashboard:keys", args=[tenant.slug]), {"name": "x"}),
                      (reverse("dashboard:key-revoke", args=[tenant.slug, key.public_id]), {}),
                      (reverse("dashboard:settings", args=[tenant.slug]), {"monthly_budget_usd": "1"}),
                      (reverse("dashboard:budget-alerts", args=[tenant.slug]), {"alert_percents": "5"}),
                      (reverse("password_change"), {}), (reverse("logout"), {})]:
        assert client.post(url, body).status_code == 403, url


def test_anonymous_goes_to_login(tenant):
    response = Client().get(reverse("dashboard:overview", args=[tenant.slug]))
    assert response.status_code == 302 and response.url.startswith("/accounts/login/")


def test_plotly_served_from_the_package(db):
    response = Client().get(reverse("dashboard:plotly-js"))
    assert response.status_code == 200 and response["Content-Type"].startswith("text/javascript")
    assert b"plotly.js" in b"".join(response.streaming_content)[:2000]


def test_usage_range_is_checked(tenant, member_factory):
    client = login(member_factory(tenant, "viewer"))
    base = reverse("dashboard:usage", args=[tenant.slug])
    too_long = client.get(base, {"start": "2026-01-01", "end": "2026-06-30"})
    assert too_long.status_code == 200 and "At most 92 days" in too_long.content.decode()
    reversed_range = client.get(reverse("dashboard:usage-csv", args=[tenant.slug]),
                                {"start": "2026-02-01", "end": "2026-01-01"})
    assert reversed_range.status_code == 400 and b"starts after it ends" in reversed_range.content
    assert client.get(base, {"key": "999999"}).status_code == 200  # not one of the tenant's keys: a form error


def test_far_dates_are_a_form_error_not_a_500(tenant_factory, member_factory):
    """A range at the calendar's edges (year 9999; year 1 in a zone east of UTC) overflowed the zone arithmetic."""
    tokyo = tenant_factory(slug="tenant-tokyo", timezone="Asia/Tokyo")
    client = login(member_factory(tokyo, "viewer"))
    for name in ("dashboard:usage", "dashboard:usage-csv"):
        url = reverse(name, args=[tokyo.slug])
        for query in ({"end": "9999-12-31"}, {"start": "0001-01-01", "end": "0001-01-05"}, {"end": "1999-12-31"}):
            response = client.get(url, query)
            assert response.status_code in (200, 400), (name, query, response.status_code)
            assert b"between 2000-01-01" in response.content or b"before 2000-01-01" in response.content


def test_a_key_limit_its_column_cannot_hold_is_a_form_error(tenant, member_factory):
    client = login(member_factory(tenant, "member"))
    url = reverse("dashboard:keys", args=[tenant.slug])
    response = client.post(url, {"name": "big", "tokens_per_minute": "3000000000"})
    assert response.status_code == 200 and b"less than or equal to 2147483647" in response.content
    assert not ApiKey.objects.filter(tenant=tenant, name="big").exists()
    response = client.post(url, {"name": "quota", "monthly_token_quota": str(2**63)})
    assert response.status_code == 200 and not ApiKey.objects.filter(tenant=tenant, name="quota").exists()


def test_a_viewer_cannot_tell_which_keys_exist(tenant, member_factory, api_key_factory):
    key = api_key_factory(tenant=tenant).api_key
    client = login(member_factory(tenant, "viewer"))
    for key_id in (key.public_id, "key_doesnotexist0000000"):
        assert client.post(reverse("dashboard:key-revoke", args=[tenant.slug, key_id])).status_code == 403


def test_the_overview_island_writes_budgets_as_plain_decimals(tenant, member_factory):
    operator_budget_set(tenant=tenant, micros=1)  # $0.000001, and nothing used: "0", not "0E-9"
    data = island(login(member_factory(tenant, "viewer")).get(reverse("dashboard:overview", args=[tenant.slug])),
                  "overview-data")
    assert data["budget_used_usd"] == "0" and data["budget_limit_usd"] == "0.000001"


def test_key_times_show_in_the_tenants_zone(tenant_factory, member_factory, api_key_factory):
    from datetime import datetime

    tokyo = tenant_factory(slug="tenant-tz", timezone="Asia/Tokyo")
    key = api_key_factory(tenant=tokyo).api_key
    ApiKey.objects.filter(pk=key.pk).update(created_at=datetime(2026, 3, 1, 20, 30, tzinfo=UTC))
    page = login(member_factory(tokyo, "viewer")).get(reverse("dashboard:keys", args=[tokyo.slug])).content.decode()
    assert "2026-03-02 05:30 JST" in page  # 20:30 UTC is 05:30 the next day in Tokyo
