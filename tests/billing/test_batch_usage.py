"""Batch usage shown apart (issue 39): the usage API's `batch` filter and `group_by=batch` (OpenAI's), the
costs API's batch line items, and invoice lines per model for batch usage, labelled; the rollups keep live and
batch apart; every figure still equals the records' sums."""

from collections import Counter
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest
import time_machine

from billing.models import DailyUsage, HourlyUsage, InvoiceLine, UsageRecord
from billing.periods import month_parse
from billing.services.invoices import invoice_correct, invoice_draft_refresh, invoice_finalize
from billing.services.rollups import hourly_usage_fill
from tests.conftest import bearer

UTC = timezone.utc
START = datetime(2026, 3, 1, tzinfo=UTC)
NOW = START + timedelta(days=3)
USAGE = "/v1/organization/usage/completions"
COSTS = "/v1/organization/costs"


@pytest.fixture
def usage(tenant_factory, api_key_factory, price_factory, record_write):
    """A tenant's live requests and batch lines of two models over 3 days (another tenant's batch beside them),
    rolled up to day 2 noon: the figures come from days, hours and the raw records alike."""
    price_factory(model="x", input="2", cached="1", output="8")
    price_factory(model="y", input="0.3", cached="0.15", output="1.2")
    a, b = tenant_factory(), tenant_factory()
    key = api_key_factory(tenant=a)
    other = api_key_factory(tenant=b)
    n = 0
    for hour in range(0, 72, 5):
        when = START + timedelta(hours=hour, minutes=7)
        for model in "xy":
            n += 1
            with time_machine.travel(when, tick=False):
                record_write(a, key.api_key, model=model, admitted_at=when, prompt_tokens=1000 + hour,
                             cached_tokens=hour * 3, completion_tokens=100 + n)
                record_write(a, key.api_key, model=model, admitted_at=when, batch_id="batch_A",
                             request_id=f"batch_A-{n}", prompt_tokens=2000 + hour, cached_tokens=hour,
                             completion_tokens=50 + n)
    with time_machine.travel(START + timedelta(hours=3), tick=False):
        record_write(b, other.api_key, model="x", batch_id="batch_B", request_id="batch_B-1", prompt_tokens=99_999)
    hourly_usage_fill(now=START + timedelta(days=1, hours=12))
    return a, key


def pages(api_client, url, key, **params):
    results, params = [], {"start_time": int(START.timestamp()), "end_time": int(NOW.timestamp()), **params}
    with time_machine.travel(NOW, tick=False):
        while True:
            response = api_client.get(url, params, **bearer(key))
            assert response.status_code == 200, response.content
            body = response.json()
            results += [r for bucket in body["data"] for r in bucket["results"]]
            if not body["has_more"]:
                return results
            params = {**params, "page": body["next_page"]}


def records(tenant, **filters) -> Counter:
    table: Counter = Counter()
    for r in UsageRecord.objects.filter(tenant=tenant, **filters):
        key = (r.model, r.is_batch)
        table[key + ("requests",)] += 1
        table[key + ("input",)] += r.prompt_tokens
        table[key + ("output",)] += r.completion_tokens
    return table


def reported(results) -> Counter:
    table: Counter = Counter()
    for r in results:
        key = (r["model"], r["batch"])
        table[key + ("requests",)] += r["num_model_requests"]
        table[key + ("input",)] += r["input_tokens"]
        table[key + ("output",)] += r["output_tokens"]
    return +table


@pytest.mark.django_db
def test_the_rollups_keep_batch_lines_apart(usage):
    tenant, _ = usage
    assert set(HourlyUsage.objects.filter(tenant=tenant).values_list("batch", flat=True)) == {False, True}
    assert set(DailyUsage.objects.filter(tenant=tenant).values_list("batch", flat=True)) == {False, True}
    rolled = sum(HourlyUsage.objects.filter(tenant=tenant, batch=True).values_list("requests", flat=True))
    assert rolled == UsageRecord.objects.filter(tenant=tenant, created_at__lt=START + timedelta(days=1, hours=12)
                                                ).exclude(batch_id="").count()


@pytest.mark.django_db
@pytest.mark.parametrize("width", ["1d", "1h"])
def test_group_by_batch_equals_the_records(api_client, usage, width):
    tenant, key = usage
    results = pages(api_client, USAGE, key.key, bucket_width=width, group_by="model,batch", limit=168 if width ==
                    "1h" else 31)
    assert {r["batch"] for r in results} == {True, False}
    assert reported(results) == records(tenant)


@pytest.mark.django_db
@pytest.mark.parametrize("batch", ["true", "false"])
def test_the_batch_filter(api_client, usage, batch):
    tenant, key = usage
    results = pages(api_client, USAGE, key.key, bucket_width="1d", batch=batch, group_by="model")
    assert all(r["batch"] is None for r in results)  # not grouped by batch: null, as OpenAI's
    lines = UsageRecord.objects.filter(tenant=tenant)
    lines = lines.exclude(batch_id="") if batch == "true" else lines.filter(batch_id="")
    assert sum(r["num_model_requests"] for r in results) == lines.count()
    assert sum(r["output_tokens"] for r in results) == sum(lines.values_list("completion_tokens", flat=True))
    minutes = pages(api_client, USAGE, key.key, bucket_width="1m", batch=batch, group_by="batch",
                    end_time=int((START + timedelta(hours=6)).timestamp()), limit=1440)
    assert {r["batch"] for r in minutes} == {batch == "true"}
    early = lines.filter(created_at__lt=START + timedelta(hours=6))
    assert sum(r["num_model_requests"] for r in minutes) == early.count()


@pytest.mark.django_db
def test_a_bad_batch_filter_or_group_is_400(api_client, usage):
    _, key = usage
    for params in ({"batch": "yes"}, {"group_by": "batches"}):
        response = api_client.get(USAGE, {"start_time": int(START.timestamp()), **params}, **bearer(key.key))
        assert response.status_code == 400
        assert response.json()["error"]["param"] in ("batch", "group_by")


@pytest.mark.django_db
def test_costs_show_batch_line_items(api_client, usage):
    tenant, key = usage
    results = pages(api_client, COSTS, key.key, group_by="line_item", limit=180)
    items = Counter()
    for r in results:
        items[r["line_item"]] += Decimal(r["amount"]["value_decimal"])
    assert {"x, input", "x, batch input", "y, batch cached input", "y, batch output"} <= set(items)
    for model in "xy":
        for batch, word in ((True, "batch "), (False, "")):
            lines = UsageRecord.objects.filter(tenant=tenant, model=model)
            lines = lines.exclude(batch_id="") if batch else lines.filter(batch_id="")
            output = sum(lines.values_list("output_cost_femtos", flat=True))
            assert items[f"{model}, {word}output"] == Decimal(output).scaleb(-15)
    total = pages(api_client, COSTS, key.key, limit=180)
    femtos = sum(UsageRecord.objects.filter(tenant=tenant).values_list("cost_femtos", flat=True))
    assert sum(Decimal(r["amount"]["value_decimal"]) for r in total) == Decimal(femtos).scaleb(-15)


@pytest.mark.django_db
def test_invoice_lines_per_model_for_batch_usage_labelled(api_client, usage, record_write):
    tenant, key = usage
    march = month_parse(label="2026-03", tz="UTC")
    invoice = invoice_draft_refresh(tenant=tenant, period=march, now=NOW)
    lines = list(invoice.lines.all())
    batch_lines = [line for line in lines if line.batch]
    assert {(line.model, line.kind) for line in batch_lines} == {
        (m, k) for m in "xy" for k in ("input", "cached_input", "output")}
    by = {(line.model, line.kind, line.batch): line for line in lines}
    assert by[("x", "output", True)].unit_price_per_million == "4"  # 8 USD per 1M, 50% off
    assert by[("x", "output", False)].unit_price_per_million == "8"
    assert "(batch, 50% off)" in by[("x", "output", True)].description
    assert "batch" not in by[("x", "output", False)].description
    batch_femtos = sum(UsageRecord.objects.filter(tenant=tenant, model="x").exclude(batch_id="")
                       .values_list("output_cost_femtos", flat=True))
    assert Decimal(by[("x", "output", True)].exact_usd) == Decimal(batch_femtos).scaleb(-15)
    # the API shows which lines are batch
    body = api_client.get(f"/v1/invoices/{invoice.public_id}", **bearer(key.key)).json()
    assert {line["batch"] for line in body["lines"]} == {True, False}
    # a late batch line after the invoice is final: a credit note with a batch line, nothing else
    invoice = invoice_finalize(invoice=invoice, now=march.end + timedelta(days=3))
    with time_machine.travel(START + timedelta(days=4), tick=False):
        record_write(tenant, key.api_key, model="x", batch_id="batch_A", request_id="batch_A-999",
                     admitted_at=START, prompt_tokens=10, cached_tokens=0, completion_tokens=0)
    note = invoice_correct(invoice=invoice, now=march.end + timedelta(days=4))
    assert [(line.model, line.kind, line.batch, line.quantity) for line in note.lines.all()] == [
        ("x", InvoiceLine.Kind.INPUT, True, 10)]
