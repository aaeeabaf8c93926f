"""The dashboard and the operator console in a real browser (Debian's chromium), against a real server."""

from __future__ import annotations

import sqlite3
import threading
import zoneinfo
from datetime import datetime
from datetime import timezone as dt_timezone
from decimal import Decimal

import httpx
import pytest

from tests.browser.conftest import long_completion, member_key, screenshot

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.slow]

UTC = dt_timezone.utc
MODEL = "smollm2-135m-instruct"


def ledger_by_local_day(database, slug: str) -> tuple[str, dict[str, dict]]:
    """The usage records of a tenant summed per day of its time zone, straight from the server's database."""
    with sqlite3.connect(database) as conn:
        tz = conn.execute("SELECT timezone FROM tenants_tenant WHERE slug = ?", (slug,)).fetchone()[0]
        rows = conn.execute(
            "SELECT r.created_at, r.prompt_tokens, r.cached_tokens, r.completion_tokens, r.cost_femtos "
            "FROM tenants_usagerecord r JOIN tenants_tenant t ON t.id = r.tenant_id WHERE t.slug = ?", (slug,))
        zone = zoneinfo.ZoneInfo(tz)
        days: dict[str, dict] = {}
        for created, prompt, cached, completion, cost in rows:
            day = datetime.fromisoformat(created).replace(tzinfo=UTC).astimezone(zone).date().isoformat()
            sums = days.setdefault(day, {"requests": 0, "input_tokens": 0, "cached_input_tokens": 0,
                                         "output_tokens": 0, "cost_femtos": 0})
            sums["requests"] += 1
            sums["input_tokens"] += prompt - cached
            sums["cached_input_tokens"] += cached
            sums["output_tokens"] += completion
            sums["cost_femtos"] += int(cost)  # FemtosField: decimal text on SQLite
    return tz, days


def island(page, name: str):
    return page.evaluate(f"JSON.parse(document.getElementById({name!r}).textContent)")


def csrf_token(page) -> str:
    return next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")


def test_member_sees_charts_equal_to_the_ledger(new_page, site):
    page = new_page("acme-member")
    assert page.url.endswith("/dashboard/acme/")
    overview = island(page, "overview-data")
    screenshot(page, "overview")
    page.click("text=Usage")
    page.wait_for_function("document.getElementById('chart-tokens').data !== undefined")
    screenshot(page, "usage")
    data = island(page, "usage-data")
    tz, ledger = ledger_by_local_day(site["database"], "acme")
    assert data["timezone"] == tz == "America/New_York" and page.inner_text("#timezone") == tz
    shown = {row["day"]: row for row in data["days"] if row["requests"]}
    assert set(shown) == set(ledger)
    for day, sums in ledger.items():
        row = shown[day]
        assert {k: row[k] for k in ("requests", "input_tokens", "cached_input_tokens", "output_tokens")} == \
            {k: sums[k] for k in ("requests", "input_tokens", "cached_input_tokens", "output_tokens")}
        assert Decimal(row["spend_usd"]) == Decimal(sums["cost_femtos"]).scaleb(-15)
    # what plotly drew is the island's numbers
    drawn = page.evaluate("['chart-tokens', 'chart-spend'].map(id => document.getElementById(id).data.map(t => t.y))")
    assert drawn[0] == [[row[k] for row in data["days"]] for k in ("input_tokens", "cached_input_tokens",
                                                                     "output_tokens")]
    assert drawn[1][0] == [float(Decimal(row["spend_usd"])) for row in data["days"]]
    # the accessible table holds the same rows (the days without a request folded into runs), and the CSV every day
    table_days = page.eval_on_selector_all("#usage-table tbody tr:not(.quiet) th",
                                           "cells => cells.map(c => c.textContent)")
    assert table_days == [row["day"] for row in data["days"] if row["requests"]]
    csv_text = page.context.request.get(page.get_attribute("#usage-csv", "href")).text()
    csv_spend = {line.split(",")[0]: line.split(",")[5] for line in csv_text.splitlines()[2:]}
    assert csv_spend == {row["day"]: row["spend_usd"] for row in data["days"]}
    # the overview's period figures are the ledger's sums over the days of this month
    month = overview["period"]
    in_month = [sums for day, sums in ledger.items() if day.startswith(month)]
    assert overview["requests"] == sum(s["requests"] for s in in_month)
    assert Decimal(overview["spend_usd"]) == Decimal(sum(s["cost_femtos"] for s in in_month)).scaleb(-15)
    page.click("text=Invoices")
    screenshot(page, "invoices")
    page.click(f"a[href='/dashboard/acme/invoices/{site['seed']['invoices']['acme']}/']")
    screenshot(page, "invoice-detail")
    page.click("text=Limits & budget")
    screenshot(page, "settings")


def test_key_created_used_revoked_refused(new_page, site):
    page = new_page("acme-member")
    page.goto("/dashboard/acme/keys/")
    page.fill("input[name=name]", "browser-key")
    page.check("input[name=scopes][value=inference]")
    page.click("#create-key [type=submit]")
    secret = page.inner_text("#new-key-secret")
    screenshot(page, "key-created")
    models = httpx.get(f"{site['url']}/v1/models", headers={"Authorization": f"Bearer {secret}"}, timeout=30)
    assert models.status_code == 200 and MODEL in [m["id"] for m in models.json()["data"]]
    page.goto("/dashboard/acme/keys/")
    assert secret not in page.content() and page.locator("#new-key-secret").count() == 0
    page.click("button[aria-label='Revoke browser-key']")
    page.wait_for_load_state()
    screenshot(page, "keys")
    assert page.locator("tr:has(th:text('browser-key')) .status").inner_text() == "revoked"
    refused = httpx.get(f"{site['url']}/v1/models", headers={"Authorization": f"Bearer {secret}"}, timeout=30)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"


def test_viewer_cannot_create_keys(new_page):
    page = new_page("acme-viewer")
    page.goto("/dashboard/acme/keys/")
    assert page.locator("#create-key").count() == 0 and page.locator("#read-only").count() == 1
    response = page.context.request.post("/dashboard/acme/keys/", form={
        "name": "viewer-key", "csrfmiddlewaretoken": csrf_token(page)}, headers={"Referer": page.url})
    assert response.status == 403
    page.goto("/dashboard/acme/keys/")
    assert "viewer-key" not in page.content()


def test_member_of_a_gets_404_on_tenant_b(new_page, site):
    page = new_page("acme-member")
    invoice = site["seed"]["invoices"]["globex"]
    key = site["seed"]["globex_key_id"]
    request = page.context.request
    for path in ["/dashboard/globex/", "/dashboard/globex/usage/", "/dashboard/globex/usage.csv",
                 "/dashboard/globex/keys/", "/dashboard/globex/invoices/", "/dashboard/globex/settings/",
                 f"/dashboard/globex/invoices/{invoice}/", f"/dashboard/acme/invoices/{invoice}/",
                 f"/billing/invoices/{invoice}/", f"/billing/invoices/{invoice}.csv"]:
        assert request.get(path).status == 404, path
    token = {"csrfmiddlewaretoken": csrf_token(page)}
    for path in [f"/dashboard/globex/keys/{key}/revoke/", f"/dashboard/acme/keys/{key}/revoke/",
                 "/dashboard/globex/keys/", "/dashboard/globex/settings/"]:
        assert request.post(path, form={**token, "name": "x"}, headers={"Referer": page.url}).status == 404, path


def test_every_form_refuses_a_post_without_its_csrf_token(new_page, browser, site):
    anonymous = browser.new_context(base_url=site["url"])
    try:
        assert anonymous.request.post("/accounts/login/", form={"username": "acme-member",
                                                                 "password": "x"}).status == 403
    finally:
        anonymous.close()
    page = new_page("acme-member")
    request = page.context.request
    forms = [("/dashboard/acme/keys/", {"name": "no-token"}), ("/dashboard/acme/settings/", {"monthly_budget_usd": "1"}),
             ("/dashboard/acme/settings/alerts/", {"alert_percents": "5"}),
             ("/accounts/password_change/", {"old_password": "x", "new_password1": "y", "new_password2": "y"}),
             ("/accounts/logout/", {})]
    with sqlite3.connect(site["database"]) as conn:
        key_id = conn.execute("SELECT k.public_id FROM tenants_apikey k JOIN tenants_tenant t ON t.id = k.tenant_id "
                              "WHERE t.slug = 'acme' AND k.revoked_at IS NULL").fetchone()[0]
    forms.append((f"/dashboard/acme/keys/{key_id}/revoke/", {}))
    for path, body in forms:
        assert request.post(path, form=body, headers={"Referer": page.url}).status == 403, path
    page.goto("/dashboard/acme/keys/")
    assert "no-token" not in page.content() and page.url.endswith("/dashboard/acme/keys/")  # still logged in


def _depths(page) -> int:
    return sum(int(cell) for cell in page.eval_on_selector_all("#queues tbody td.num", "cs => cs.map(c => c.textContent)"))


def test_operator_sees_a_live_worker_and_the_queue_move(new_page, site):
    page = new_page("admin", site["admin_password"], admin=True)
    key = member_key(new_page, "load")
    call = long_completion(site, key)
    call()  # starts the embedded worker and loads the model
    page.goto("/admin/console/")
    page.wait_for_selector("#workers tbody tr")
    worker = page.eval_on_selector_all("#workers tbody tr td", "cs => cs.map(c => c.textContent)")
    assert worker[1] == MODEL and worker[3] == "serving"
    assert _depths(page) == 0
    load = [threading.Thread(target=call) for _ in range(8)]
    for thread in load:
        thread.start()
    page.wait_for_function("[...document.querySelectorAll('#queues tbody td.num')]"
                           ".some(c => Number(c.textContent) > 0)", timeout=120_000)
    screenshot(page, "console-under-load")
    seen = _depths(page)
    for thread in load:
        thread.join(300)
    page.wait_for_function("[...document.querySelectorAll('#queues tbody td.num')]"
                           ".every(c => Number(c.textContent) === 0)", timeout=60_000)
    assert seen > 0 and _depths(page) == 0
    page.wait_for_function("Number(document.getElementById('rps').textContent) > 0", timeout=30_000)
    screenshot(page, "console")
