"""The usage page's model filter and "by model" breakdown, through Django's test client: two models at their
own prices for one tenant, another tenant's records beside them. Every figure is checked against the usage
records summed here (the ledger), in exact decimals; hostile query values are a form error, never a 500 or
another tenant's figures."""

from __future__ import annotations

import csv
import io
import itertools
import random
import re
import zoneinfo
from datetime import date, datetime, timedelta
from datetime import timezone as dt_timezone
from decimal import Decimal

import pytest
from django.test import Client
from django.urls import reverse

from billing.models import UsageRecord
from billing.selectors import days_between
from billing.services.rollups import hourly_usage_fill
from dashboard.selectors.usage import usage_by_day, usage_by_day_and_model, usage_totals
from tests.dashboard.test_pages import island

UTC = dt_timezone.utc
SMOL, GEMMA, OTHERS = "smollm2-135m-instruct", "gemma-3-270m", "other-tenants-model"
PRICES = {SMOL: ("0.5", "0.125", "1.5"), GEMMA: ("0.8", "0.2", "3.2"), OTHERS: ("9", "9", "9")}
START = datetime(2026, 3, 6, 0, tzinfo=UTC)  # spans the US DST change of 2026-03-08
FIRST, LAST = date(2026, 3, 6), date(2026, 3, 11)
_seq = itertools.count(1)


@pytest.fixture
def prices(db):
    from billing.services.prices import EPOCH, price_create

    return {model: price_create(model=model, input_per_million=i, cached_input_per_million=c,
                                output_per_million=o, effective_from=EPOCH) for model, (i, c, o) in PRICES.items()}


@pytest.fixture
def seed(prices):
    """seed(tenant, model, start, hours, per_hour, seed) -> the records, priced at the model's own price."""
    from billing.money import cost_compute

    def make(tenant, model: str, *, start: datetime = START, hours: int = 24 * 6, per_hour: int = 2, seed: int = 1,
             key=None):
        rng, price, rows = random.Random(seed), prices[model], []
        for hour in range(hours):
            for _ in range(per_hour):
                when = start + timedelta(hours=hour, seconds=rng.randint(0, 3599))
                prompt = rng.randint(5, 400)
                cached, completion = rng.randint(0, prompt), rng.randint(1, 200)
                cost = cost_compute(terms=price.terms, multiplier_milli=1000, prompt_tokens=prompt,
                                    cached_tokens=cached, completion_tokens=completion)
                rows.append(UsageRecord(
                    request_id=f"models-{next(_seq)}", tenant=tenant, api_key=key, model=model, tier=tenant.tier.name,
                    prompt_tokens=prompt, cached_tokens=cached, completion_tokens=completion, finish_reason="stop",
                    ttft_s=round(rng.uniform(0.01, 2.0), 4), created_at=when, admitted_at=when, price=price,
                    input_cost_femtos=cost.input, cached_input_cost_femtos=cost.cached_input,
                    output_cost_femtos=cost.output, cost_femtos=cost.total))
        UsageRecord.objects.bulk_create(rows)
        return rows

    return make


def ledger(records, tz: str, first: date, last: date, model: str | None = None) -> dict[str, dict]:
    """Day -> requests, tokens by kind, spend (Decimal USD), summed from the records here, not by the app."""
    zone = zoneinfo.ZoneInfo(tz)
    out = {(first + timedelta(days=i)).isoformat(): {"requests": 0, "input_tokens": 0, "cached_input_tokens": 0,
                                                     "output_tokens": 0, "femtos": 0}
           for i in range((last - first).days + 1)}
    for r in records:
        day = r.created_at.astimezone(zone).date().isoformat()
        if day in out and model in (None, r.model):
            sums = out[day]
            sums["requests"] += 1
            sums["input_tokens"] += r.prompt_tokens - r.cached_tokens
            sums["cached_input_tokens"] += r.cached_tokens
            sums["output_tokens"] += r.completion_tokens
            sums["femtos"] += r.cost_femtos
    for sums in out.values():
        sums["spend_usd"] = Decimal(sums.pop("femtos")).scaleb(-15)
    return out


def shown(row: dict) -> dict:
    return {**{k: row[k] for k in ("requests", "input_tokens", "cached_input_tokens", "output_tokens")},
            "spend_usd": Decimal(row["spend_usd"])}


def total(days: dict[str, dict]) -> dict:
    return {k: sum((d[k] for d in days.values()), Decimal(0) if k == "spend_usd" else 0)
            for k in ("requests", "input_tokens", "cached_input_tokens", "output_tokens", "spend_usd")}


@pytest.fixture
def two_models(tenant_factory, member_factory, seed):
    """(client of tenant A's member, A, its records, tenant B): A used both models, B its own and one of A's."""
    def make(tz: str = "UTC"):
        a, b = tenant_factory(slug="models-a", timezone=tz), tenant_factory(slug="models-b", timezone=tz)
        records = seed(a, SMOL, seed=1) + seed(a, GEMMA, per_hour=1, seed=2)
        seed(b, OTHERS, seed=3)
        seed(b, GEMMA, per_hour=3, seed=4)  # B's usage of a model A uses too: never in A's figures
        hourly_usage_fill(now=START + timedelta(days=3, hours=7))  # half from the rollups, half from the records
        client = Client()
        client.force_login(member_factory(a, "viewer"))
        return client, a, records, b

    return make


def picker(response) -> list[tuple[str, str, bool]]:
    """The model picker's options: (value, label, selected)."""
    select = re.search(r'<select name="model"[^>]*>(.*?)</select>', response.content.decode(), re.S)
    assert select, "no model picker"
    return [(value, label, bool(selected)) for value, selected, label in
            re.findall(r'<option value="([^"]*)"( selected)?>([^<]*)</option>', select.group(1))]


@pytest.mark.parametrize("tz", ["UTC", "Asia/Kolkata"])  # Kolkata: midnights inside UTC hours (per-minute path)
def test_the_model_filter_narrows_every_figure_to_the_ledgers(two_models, tz):
    client, a, records, _ = two_models(tz)
    url, query = reverse("dashboard:usage", args=[a.slug]), {"start": FIRST.isoformat(), "end": LAST.isoformat()}
    everything = client.get(url, query)
    data = island(everything, "usage-data")
    assert [value for value, _, _ in picker(everything)] == ["", GEMMA, SMOL]  # "All models" and A's, never B's
    assert picker(everything)[0][1] == "All models" and data["models"] == [GEMMA, SMOL]
    all_days = ledger(records, tz, FIRST, LAST)
    assert {row["day"]: shown(row) for row in data["days"]} == all_days
    assert Decimal(data["total_spend_usd"]) == total(all_days)["spend_usd"]
    assert {k: Decimal(v) if k == "spend_usd" else v for k, v in data["totals"].items()} == total(all_days)
    by_model = {row["model"]: shown(row) for row in data["by_model"]}
    assert list(by_model) == sorted(by_model, key=lambda m: -by_model[m]["spend_usd"])  # most spend first
    spend_chart = island(everything, "chart-specs")["chart-spend-models"]
    assert {trace["name"] for trace in spend_chart["data"]} == {GEMMA, SMOL}
    for model in (SMOL, GEMMA):
        expected = ledger(records, tz, FIRST, LAST, model)
        assert by_model[model] == total(expected)
        narrowed = client.get(url, {**query, "model": model})
        assert (model, model, True) in picker(narrowed)  # the pick stays picked
        one = island(narrowed, "usage-data")
        assert one["model"] == model and {row["day"]: shown(row) for row in one["days"]} == expected
        assert [row["model"] for row in one["by_model"]] == [model]
        assert Decimal(one["total_spend_usd"]) == total(expected)["spend_usd"]
        specs = island(narrowed, "chart-specs")
        assert "chart-spend-models" not in specs  # one model: the spend chart is its picture
        assert specs["chart-spend"]["data"][0]["customdata"] == [row["spend_usd"] for row in one["days"]]
        trace = next(t for t in spend_chart["data"] if t["name"] == model)
        assert [Decimal(v) for v in trace["customdata"]] == [expected[d]["spend_usd"] for d in sorted(expected)]
        day_csv = list(csv.reader(io.StringIO(client.get(reverse("dashboard:usage-csv", args=[a.slug]),
                                                         {**query, "model": model}).content.decode())))
        assert f"model {model};" in day_csv[0][0]
        assert {r[0]: Decimal(r[5]) for r in day_csv[2:]} == {d: s["spend_usd"] for d, s in expected.items()}
    # the two models' figures add up to the whole, to the femto-dollar
    assert sum((m["spend_usd"] for m in by_model.values()), Decimal(0)) == total(all_days)["spend_usd"]


def test_the_by_model_csv_is_the_by_model_table(two_models):
    client, a, records, _ = two_models()
    query = {"start": FIRST.isoformat(), "end": LAST.isoformat()}
    data = island(client.get(reverse("dashboard:usage", args=[a.slug]), query), "usage-data")
    response = client.get(reverse("dashboard:usage-by-model-csv", args=[a.slug]), query)
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    assert f"usage-by-model-{a.slug}-{FIRST}-{LAST}.csv" in response["Content-Disposition"]
    rows = list(csv.reader(io.StringIO(response.content.decode())))
    assert rows[1] == ["model", "requests", "input_tokens", "cached_input_tokens", "output_tokens", "spend_usd"]
    assert rows[2:] == [[str(row[k]) for k in rows[1]] for row in data["by_model"]]
    assert {r[0]: Decimal(r[5]) for r in rows[2:]} == {
        model: total(ledger(records, "UTC", FIRST, LAST, model))["spend_usd"] for model in (SMOL, GEMMA)}


def test_the_picker_offers_the_models_of_the_range_and_a_pick_survives_a_new_range(two_models, seed):
    client, a, _, _ = two_models()
    later = START + timedelta(days=40)
    recent = seed(a, SMOL, start=later, hours=5, seed=9)  # 40 days on: only smollm2
    url = reverse("dashboard:usage", args=[a.slug])
    query = {"start": later.date().isoformat(), "end": (later.date() + timedelta(days=2)).isoformat()}
    page = client.get(url, query)
    assert [value for value, _, _ in picker(page)] == ["", SMOL]
    # gemma picked in the earlier range, then the range moved on: still picked, and nothing in this range
    moved = client.get(url, {**query, "model": GEMMA})
    data = island(moved, "usage-data")
    assert [value for value, _, _ in picker(moved)] == ["", GEMMA, SMOL] and (GEMMA, GEMMA, True) in picker(moved)
    assert data["model"] == GEMMA and data["by_model"] == [] and data["total_spend_usd"] == "0"
    assert all(row["requests"] == 0 for row in data["days"])
    smol = island(client.get(url, {**query, "model": SMOL}), "usage-data")
    assert sum(row["requests"] for row in smol["days"]) == len(recent)


HOSTILE = [OTHERS, "no-such-model", "x" * 5000, "smol\x00lm", "' OR 1=1 --", "../../etc/passwd", "%", "*",
           "SmolLM2-135M-Instruct", "<script>alert(1)</script>", "模型"]


@pytest.mark.parametrize("value", HOSTILE)
def test_an_unknown_or_foreign_model_is_a_form_error_never_a_500_or_their_figures(two_models, member_factory,
                                                                                   value):
    client, a, _, b = two_models()
    query = {"start": FIRST.isoformat(), "end": LAST.isoformat(), "model": value}
    page = client.get(reverse("dashboard:usage", args=[a.slug]), query)
    body = page.content.decode()
    assert page.status_code == 200 and 'id="error-model"' in body
    assert 'id="usage-data"' not in body and 'id="usage-by-model"' not in body  # no figures at all
    assert OTHERS not in [option for option, _, _ in picker(page)] and "<script>alert(1)</script>" not in body
    for name in ("dashboard:usage-csv", "dashboard:usage-by-model-csv"):
        response = client.get(reverse(name, args=[a.slug]), query)
        assert response.status_code == 400 and response["Content-Type"].startswith("text/plain")
    if value == OTHERS:  # a real model, B's: B's own member gets its figures, A's member never did
        theirs = Client()
        theirs.force_login(member_factory(b, "viewer"))
        data = island(theirs.get(reverse("dashboard:usage", args=[b.slug]), query), "usage-data")
        assert [row["model"] for row in data["by_model"]] == [OTHERS]


def test_two_model_values_and_an_empty_one(two_models):
    client, a, records, _ = two_models()
    url = reverse("dashboard:usage", args=[a.slug])
    base = f"{url}?start={FIRST}&end={LAST}"
    both = island(client.get(f"{base}&model={SMOL}&model={GEMMA}"), "usage-data")  # the last one counts
    assert both["model"] == GEMMA and [row["model"] for row in both["by_model"]] == [GEMMA]
    empty = island(client.get(f"{base}&model="), "usage-data")
    assert empty["model"] is None and len(empty["by_model"]) == 2
    assert client.get(f"{url}?model={OTHERS}&start=not-a-date").status_code == 200


def test_model_and_key_filters_together(two_models, api_key_factory, seed):
    client, a, _, _ = two_models()
    key = api_key_factory(tenant=a).api_key
    keyed = seed(a, GEMMA, start=START + timedelta(days=4), hours=3, seed=11, key=key)  # after the rollup's end
    data = island(client.get(reverse("dashboard:usage", args=[a.slug]), {
        "start": FIRST.isoformat(), "end": LAST.isoformat(), "model": GEMMA, "key": key.public_id}), "usage-data")
    assert sum(row["requests"] for row in data["days"]) == len(keyed)
    assert Decimal(data["total_spend_usd"]) == Decimal(sum(r.cost_femtos for r in keyed)).scaleb(-15)


@pytest.mark.parametrize("tz", ["America/Los_Angeles", "Asia/Kathmandu"])
def test_per_model_days_add_up_to_the_days(two_models, tz):
    """billing's per-model read is usage_by_day's buckets grouped: summed over the models, the same integers."""
    _, a, _, _ = two_models(tz)
    days = days_between(first=FIRST, last=LAST, tz=tz)
    per_model = usage_by_day_and_model(tenant=a, days=days)
    assert {day: usage_totals(models) for day, models in per_model.items()} == usage_by_day(tenant=a, days=days)
    only_smol = usage_by_day_and_model(tenant=a, days=days, models=(SMOL,))
    assert {day: models.get(SMOL) for day, models in only_smol.items()} == {
        day: models.get(SMOL) for day, models in per_model.items()}
    assert all(set(models) <= {SMOL} for models in only_smol.values())
