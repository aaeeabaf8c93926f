"""The OpenAI-compatible usage and costs APIs: sums equal the records' for every grouping and bucket
width (rolled-up hours and the raw tail alike); a key sees its own tenant only."""

import random
from collections import Counter
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest
import time_machine

from billing.models import UsageRecord
from billing.services.rollups import hourly_usage_fill
from tests.conftest import bearer

UTC = timezone.utc
START = datetime(2026, 3, 1, tzinfo=UTC)
NOW = START + timedelta(days=3)
GROUPS = {"model": lambda r: r.model, "api_key_id": lambda r: r.api_key.public_id if r.api_key else None,
          "service_tier": lambda r: r.tier}


@pytest.fixture
def usage(tenant_factory, api_key_factory, price_factory, record_write):
    """Tenant A: 120 records over 3 days, 3 models, 2 keys, 2 tiers; rolled up to day 2 noon."""
    rng = random.Random(7)
    for model in "xyz":
        price_factory(model=model, input="1.5", cached="0.3", output="6")
    a, b = tenant_factory(), tenant_factory()
    keys = [api_key_factory(tenant=a), api_key_factory(tenant=a)]
    key_b = api_key_factory(tenant=b)
    for i in range(120):
        when = START + timedelta(seconds=rng.randint(0, 3 * 86400 - 1))
        prompt = rng.randint(1, 3000)
        with time_machine.travel(when, tick=False):
            record_write(a, rng.choice(keys).api_key, model=rng.choice("xyz"), tier=rng.choice(["free", "pro"]),
                         prompt_tokens=prompt, cached_tokens=rng.randint(0, prompt),
                         completion_tokens=rng.randint(0, 500), admitted_at=when)
    with time_machine.travel(START + timedelta(hours=5), tick=False):
        record_write(b, key_b.api_key, model="x", prompt_tokens=77_777, completion_tokens=7)
    hourly_usage_fill(now=START + timedelta(days=1, hours=12))
    return a, keys, key_b


def get_all(api_client, url, key, **params):
    """Every bucket, following next_page."""
    buckets = []
    while True:
        response = api_client.get(url, params, **bearer(key))
        assert response.status_code == 200, response.content
        body = response.json()
        assert body["object"] == "page"
        buckets += body["data"]
        if not body["has_more"]:
            return buckets
        params = {**params, "page": body["next_page"]}


def expected(tenant, width: timedelta, group_by: tuple[str, ...]) -> Counter:
    table: Counter = Counter()
    for r in UsageRecord.objects.filter(tenant=tenant).select_related("api_key"):
        bucket = START + (r.created_at - START) // width * width
        key = (int(bucket.timestamp()), *(GROUPS[g](r) for g in group_by))
        table[key + ("input",)] += r.prompt_tokens
        table[key + ("cached",)] += r.cached_tokens
        table[key + ("output",)] += r.completion_tokens
        table[key + ("requests",)] += 1
    return table


def reported(buckets, group_by: tuple[str, ...]) -> Counter:
    table: Counter = Counter()
    for bucket in buckets:
        for result in bucket["results"]:
            assert result["object"] == "organization.usage.completions.result"
            key = (bucket["start_time"], *(result[g] for g in group_by))
            table[key + ("input",)] += result["input_tokens"]
            table[key + ("cached",)] += result["input_cached_tokens"]
            table[key + ("output",)] += result["output_tokens"]
            table[key + ("requests",)] += result["num_model_requests"]
    return +table


@pytest.mark.django_db
@pytest.mark.parametrize("width", ["1m", "1h", "1d"])
@pytest.mark.parametrize("group_by", [(), ("model",), ("api_key_id",), ("service_tier",),
                                      ("model", "api_key_id", "service_tier")])
def test_usage_sums_equal_the_records(api_client, usage, width, group_by):
    tenant, keys, _ = usage
    span = {"1m": timedelta(minutes=1), "1h": timedelta(hours=1), "1d": timedelta(days=1)}[width]
    end = START + (timedelta(hours=2) if width == "1m" else timedelta(days=3))  # minute buckets: 2 hours' worth
    params = {"start_time": int(START.timestamp()), "end_time": int(end.timestamp()), "bucket_width": width,
              "limit": {"1m": 1440, "1h": 168, "1d": 31}[width]}
    if group_by:
        params["group_by"] = ",".join(group_by)
    with time_machine.travel(NOW, tick=False):
        buckets = get_all(api_client, "/v1/organization/usage/completions", keys[0].key, **params)
    assert all(b["end_time"] - b["start_time"] == span.total_seconds() for b in buckets)
    want = expected(tenant, span, group_by)
    want = +Counter({k: v for k, v in want.items() if k[0] < int(end.timestamp())})
    assert reported(buckets, group_by) == want


@pytest.mark.django_db
def test_pages_default_limits_and_filters(api_client, usage):
    tenant, keys, _ = usage
    with time_machine.travel(NOW, tick=False):
        first = api_client.get("/v1/organization/usage/completions", {"start_time": int(START.timestamp()),
                               "bucket_width": "1h"}, **bearer(keys[0].key)).json()
        assert len(first["data"]) == 24 and first["has_more"]  # OpenAI's default for 1h
        too_many = api_client.get("/v1/organization/usage/completions", {"start_time": int(START.timestamp()),
                                  "bucket_width": "1d", "limit": 32}, **bearer(keys[0].key))
        assert too_many.status_code == 400 and too_many.json()["error"]["param"] == "limit"
        only = get_all(api_client, "/v1/organization/usage/completions", keys[0].key,
                       start_time=int(START.timestamp()), models="y", api_key_ids=keys[1].api_key.public_id,
                       group_by="model,api_key_id")
    results = [r for b in only for r in b["results"]]
    assert {(r["model"], r["api_key_id"]) for r in results} == {("y", keys[1].api_key.public_id)}
    assert sum(r["num_model_requests"] for r in results) == UsageRecord.objects.filter(
        tenant=tenant, model="y", api_key=keys[1].api_key).count()


@pytest.mark.django_db
@pytest.mark.parametrize("group_by", [None, "line_item"])
def test_costs_equal_the_records(api_client, usage, group_by):
    tenant, keys, _ = usage
    params = {"start_time": int(START.timestamp()), "limit": 180}
    if group_by:
        params["group_by"] = group_by
    with time_machine.travel(NOW, tick=False):
        buckets = get_all(api_client, "/v1/organization/costs", keys[0].key, **params)
    results = [r for b in buckets for r in b["results"]]
    assert all(r["object"] == "organization.costs.result" and r["amount"]["currency"] == "usd" for r in results)
    total = sum(Decimal(r["amount"]["value_decimal"]) for r in results)
    femtos = sum(UsageRecord.objects.filter(tenant=tenant).values_list("cost_femtos", flat=True))
    assert total == Decimal(femtos).scaleb(-15)
    if group_by:
        assert {r["line_item"] for r in results} >= {"x, input", "y, cached input", "z, output"}
        per_item = sum(Decimal(r["amount"]["value_decimal"]) for r in results if r["line_item"].endswith(", output"))
        output = sum(UsageRecord.objects.filter(tenant=tenant).values_list("output_cost_femtos", flat=True))
        assert per_item == Decimal(output).scaleb(-15)


@pytest.mark.django_db
def test_a_key_sees_its_own_tenant_only(api_client, usage):
    _a, _keys, key_b = usage
    with time_machine.travel(NOW, tick=False):
        buckets = get_all(api_client, "/v1/organization/usage/completions", key_b.key,
                          start_time=int(START.timestamp()), limit=31)
        costs = get_all(api_client, "/v1/organization/costs", key_b.key, start_time=int(START.timestamp()), limit=31)
    results = [r for b in buckets for r in b["results"]]
    assert [(r["input_tokens"], r["num_model_requests"]) for r in results] == [(77_777, 1)]
    assert len([r for b in costs for r in b["results"]]) == 1


@pytest.mark.django_db
def test_errors_are_openai_shaped(api_client, api_key_factory, tenant):
    key = api_key_factory(tenant=tenant)
    url = "/v1/organization/usage/completions"
    for params, param in (({}, "start_time"), ({"start_time": 10, "bucket_width": "2h"}, "bucket_width"),
                          ({"start_time": 10, "group_by": "user_id"}, "group_by"),
                          ({"start_time": 100, "end_time": 50}, "end_time"),
                          ({"start_time": 10, "page": "%%%"}, "page")):
        response = api_client.get(url, params, **bearer(key.key))
        assert response.status_code == 400 and response.json()["error"]["param"] == param, params
    inference_only = api_key_factory(tenant=tenant, scopes=["inference"])
    denied = api_client.get(url, {"start_time": 10}, **bearer(inference_only.key))
    assert denied.status_code == 403 and denied.json()["error"]["type"] == "permission_error"
    assert api_client.get(url, {"start_time": 10}).status_code == 401
    assert api_client.get("/v1/organization/costs", {"start_time": 10, "bucket_width": "1h"},
                          **bearer(key.key)).status_code == 400


@pytest.mark.django_db
@pytest.mark.parametrize("param", ["models", "api_key_ids"])
def test_a_nul_character_in_a_list_filter_is_a_400(api_client, usage, param):
    """Found by Schemathesis on PostgreSQL (make test-postgres): a NUL in a filter reached the query and PostgreSQL
    refused the text (a 500). It is the client's error, named."""
    _tenant, keys, _ = usage
    response = api_client.get("/v1/organization/usage/completions",
                              {"start_time": int(START.timestamp()), param: "a\x00b"}, **bearer(keys[0].key))
    assert response.status_code == 400, response.content
    assert response.json()["error"]["param"] == param
