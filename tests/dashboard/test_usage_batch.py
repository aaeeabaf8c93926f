"""The usage page's live/batch filter (issue 39): Batch API lines, billed at the batch price, shown alone or
left out, in the page, its data island and both CSVs; every figure the records' sums."""

from __future__ import annotations

import csv
import io
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal

import pytest
import time_machine
from django.test import Client
from django.urls import reverse

from billing.models import UsageRecord
from billing.services.rollups import hourly_usage_fill
from billing.services.usage import usage_records_insert
from tests.dashboard.test_pages import island

UTC = timezone.utc
START = datetime(2026, 3, 6, tzinfo=UTC)
FIRST, LAST = date(2026, 3, 6), date(2026, 3, 8)


@pytest.fixture
def page(tenant_factory, member_factory, db):
    from billing.services.prices import EPOCH, price_create

    price_create(model="m-batch", input_per_million="2", cached_input_per_million="1", output_per_million="8",
                 effective_from=EPOCH)
    tenant = tenant_factory(slug="batch-a")
    for hour in range(0, 60, 3):
        when = START + timedelta(hours=hour, minutes=5)
        with time_machine.travel(when, tick=False):
            usage_records_insert([
                dict(request_id=f"live-{hour}", tenant_id=tenant.pk, api_key_id=None, model="m-batch",
                     tier=tenant.tier.name, prompt_tokens=1000, cached_tokens=100, completion_tokens=40 + hour,
                     finish_reason="stop", admitted_at=when, ttft_s=0.2),
                dict(request_id=f"batch_D-{hour}", batch_id="batch_D", tenant_id=tenant.pk, api_key_id=None,
                     model="m-batch", tier=tenant.tier.name, prompt_tokens=3000, cached_tokens=0,
                     completion_tokens=7, finish_reason="stop", admitted_at=when, ttft_s=1.5),
            ])
    hourly_usage_fill(now=START + timedelta(days=1, hours=5))
    client = Client()
    client.force_login(member_factory(tenant, "viewer"))
    return client, tenant


def sums(records) -> dict:
    return {"requests": len(records), "output_tokens": sum(r.completion_tokens for r in records),
            "spend_usd": Decimal(sum(r.cost_femtos for r in records)).scaleb(-15)}


@pytest.mark.parametrize(("batch", "only"), [("", None), ("true", True), ("false", False)])
def test_the_batch_filter_narrows_the_page_and_its_csvs(page, batch, only):
    client, tenant = page
    records = list(UsageRecord.objects.filter(tenant=tenant))
    if only is not None:
        records = [r for r in records if r.is_batch == only]
    query = {"start": FIRST.isoformat(), "end": LAST.isoformat(), "batch": batch}
    with time_machine.travel(START + timedelta(days=3), tick=False):
        response = client.get(reverse("dashboard:usage", args=[tenant.slug]), query)
        csv_text = client.get(reverse("dashboard:usage-csv", args=[tenant.slug]), query).content.decode()
    assert response.status_code == 200
    data = island(response, "usage-data")
    assert data["batch"] == only
    assert {"requests": data["totals"]["requests"], "output_tokens": data["totals"]["output_tokens"],
            "spend_usd": Decimal(data["totals"]["spend_usd"])} == sums(records)
    rows = list(csv.reader(io.StringIO(csv_text)))
    assert rows[0][0].endswith({None: "all", True: "Batch API requests only", False: "live requests only"}[only])
    assert sum(int(row[1]) for row in rows[2:]) == len(records)
    ttft = {day["ttft_p50_s"] for day in data["days"] if day["requests"]}
    assert ttft == {None: ttft, True: {1.5}, False: {0.2}}[only]


def test_a_bad_batch_value_is_a_form_error(page):
    client, tenant = page
    response = client.get(reverse("dashboard:usage", args=[tenant.slug]), {"batch": "maybe"})
    assert response.status_code == 200 and 'id="error-batch"' in response.content.decode()
    csv_response = client.get(reverse("dashboard:usage-csv", args=[tenant.slug]), {"batch": "maybe"})
    assert csv_response.status_code == 400
