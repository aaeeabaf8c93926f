"""Charts that read at a glance: dates on a date axis, dollars with enough decimals and no SI prefixes, rates
from 0 (0-100 % with nothing to show), quiet days folded in the usage table (not in its CSV), and the overview's
chart and progress bars with the budget's alert thresholds."""

from __future__ import annotations

import csv
import io
import json
import re
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from decimal import Decimal

import pytest
from django.test import Client

from dashboard.charts import overview_chart, usage_charts, usd_places
from dashboard.usage_table import usage_table_rows

UTC = dt_timezone.utc


def row(day: str, requests: int = 0, spend: str = "0", errors: int = 0) -> dict:
    return {"day": day, "requests": requests, "input_tokens": 10 * requests, "cached_input_tokens": requests,
            "output_tokens": 5 * requests, "spend_usd": spend, "ttft_p50_s": 0.1 if requests else None,
            "ttft_p95_s": 0.3 if requests else None, "errors": errors,
            "error_rate": errors / requests if requests else 0.0}


@pytest.mark.parametrize(("largest", "places"), [
    ("0", 2), ("1234.5", 2), ("1.5", 2), ("0.5", 2), ("0.05", 3), ("0.00012", 5), ("0.000000001", 9),
    ("0.0000000000001", 9),
])
def test_dollar_axes_have_enough_decimals(largest, places):
    assert usd_places([Decimal("0"), Decimal(largest)]) == places


def test_usage_charts_read_at_a_glance():
    rows = [row("2026-03-01", 3, "0.000120"), row("2026-03-02"), row("2026-03-03", 1, "0.000040")]
    charts = usage_charts(rows)
    for spec in charts.values():
        assert spec["day_axis"] and spec["layout"]["xaxis"]["type"] == "date"
        assert spec["layout"]["yaxis"]["rangemode"] == "tozero"
    spend = charts["chart-spend"]
    axis = spend["layout"]["yaxis"]
    assert axis["tickprefix"] == "$" and axis["tickformat"] == ",.5f" and axis["exponentformat"] == "none"
    assert spend["data"][0]["customdata"] == ["0.000120", "0", "0.000040"]  # hover: the exact amounts
    errors = charts["chart-errors"]["layout"]["yaxis"]
    assert errors["range"] == [0, 1] and errors["tickformat"] == ".0%"  # no errors: 0 to 100 %
    with_errors = usage_charts([row("2026-03-01", 4, "1", errors=1)])["chart-errors"]["layout"]["yaxis"]
    assert "range" not in with_errors and with_errors["rangemode"] == "tozero"


def test_quiet_days_fold_into_one_row():
    rows = [row("2026-03-01"), row("2026-03-02"), row("2026-03-03", 2, "1"), row("2026-03-04"),
            row("2026-03-05", 1, "1"), row("2026-03-06"), row("2026-03-07"), row("2026-03-08")]
    table = usage_table_rows(rows)
    assert table == [
        {"quiet": True, "first": "2026-03-01", "last": "2026-03-02", "count": 2}, {"row": rows[2]},
        {"quiet": True, "first": "2026-03-04", "last": "2026-03-04", "count": 1}, {"row": rows[4]},
        {"quiet": True, "first": "2026-03-06", "last": "2026-03-08", "count": 3},
    ]
    assert usage_table_rows([]) == []


def test_overview_chart_has_spend_and_tokens_on_two_axes():
    spec = overview_chart([{"day": "2026-03-01", "spend_usd": "0.5", "tokens": 10},
                           {"day": "2026-03-02", "spend_usd": "12.25", "tokens": 30}])
    spend, tokens = spec["data"]
    assert spend["type"] == "bar" and spend["y"] == [0.5, 12.25] and tokens["yaxis"] == "y2"
    assert spec["layout"]["yaxis"]["tickformat"] == ",.2f" and spec["layout"]["yaxis2"]["overlaying"] == "y"


def island(html: str, name: str):
    match = re.search(rf'<script id="{name}" type="application/json">(.*?)</script>', html, re.S)
    assert match, f"no data island {name}"
    return json.loads(match.group(1))


@pytest.fixture
def owner_page(tenant_factory, member_factory, seed_usage):
    def make(**tenant_fields):
        tenant = tenant_factory(**tenant_fields)
        now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
        seed_usage(tenant, start=now - timedelta(hours=3), hours=3)
        client = Client()
        client.force_login(member_factory(tenant, "owner"))
        return tenant, client
    return make


def test_overview_draws_the_period_and_the_allowances(owner_page, settings):
    settings.BUDGET_ALERT_PERCENTS = [50, 80, 100]
    tenant, client = owner_page(monthly_spend_limit_micros=1, monthly_token_quota=10**9,
                                budget_alert_percents=[25, 90])
    html = client.get(f"/dashboard/{tenant.slug}/").content.decode()
    spec = island(html, "overview-chart-spec")
    data = island(html, "overview-data")
    today = datetime.now(UTC).date()
    assert spec["data"][0]["x"][0] == today.replace(day=1).isoformat() and spec["data"][0]["x"][-1] == today.isoformat()
    assert sum(spec["data"][1]["y"]) == data["input_tokens"] + data["cached_input_tokens"] + data["output_tokens"]
    assert sum(Decimal(amount) for amount in spec["data"][0]["customdata"]) == Decimal(data["spend_usd"])
    assert 'id="chart-overview"' in html and "dashboard/charts.js" in html
    budget = re.search(r'<div class="allowance (\w+)" id="bar-budget" data-percent="([^"]+)" '
                       r'data-thresholds="([^"]+)"', html)
    assert budget and budget.group(1) == "over" and budget.group(3) == "25,90,100"  # the tenant's own thresholds
    quota = re.search(r'<div class="allowance (\w+)" id="bar-quota" data-percent="([^"]+)" data-thresholds="([^"]+)"',
                      html)
    assert quota and quota.group(1) == "ok" and quota.group(3) == "100"  # no alerts on tokens: the limit only
    assert float(quota.group(2)) == pytest.approx(data["quota_used_tokens"] * 100 / 10**9)
    assert html.count('class="mark') == 4 and 'style="left: 25%"' in html and 'style="width: 100' in html


def test_overview_without_limits_draws_no_bars(owner_page):
    tenant, client = owner_page(monthly_token_quota=0)  # 0: no quota; and no budget
    html = client.get(f"/dashboard/{tenant.slug}/").content.decode()
    assert 'class="allowance' not in html and 'id="chart-overview"' in html


def test_usage_table_folds_quiet_days_and_the_csv_keeps_every_day(owner_page):
    tenant, client = owner_page()
    today = datetime.now(UTC).date()
    query = f"start={(today - timedelta(days=91)).isoformat()}&end={today.isoformat()}"
    html = client.get(f"/dashboard/{tenant.slug}/usage/?{query}").content.decode()
    data = island(html, "usage-data")
    assert len(data["days"]) == 92
    body = re.search(r'<table id="usage-table">.*?<tbody>(.*?)</tbody>', html, re.S).group(1)
    busy = [r["day"] for r in data["days"] if r["requests"]]
    assert re.findall(r'<tr><th scope="row">([\d-]+)</th>', body) == busy
    quiet = re.findall(r'<tr class="quiet"><th scope="row">([\d-]+)(?: – ([\d-]+))?</th>', body)
    assert quiet[0][0] == data["days"][0]["day"] and len(body.split("<tr")) - 1 <= 2 * len(busy) + 1
    rows = list(csv.reader(io.StringIO(client.get(f"/dashboard/{tenant.slug}/usage.csv?{query}").content.decode())))
    assert [r[0] for r in rows[2:]] == [r["day"] for r in data["days"]]  # the CSV: every day, as before
