"""Billing reads at scale: a year of one tenant's usage (500,000 records, 3 models, 20 keys).

Measures, on the database in DATABASE_URL (migrated), against the issue's
targets (BENCHMARKS.md):

- `GET /v1/organization/usage/completions`: 31 daily buckets grouped by model
  (target p50 <= 100 ms), read from the hourly rollups;
- `GET /v1/organization/costs`: a month, daily buckets (target <= 100 ms);
- closing a month's invoice: the draft computed from the records, then
  finalized (target <= 2 s);
- the rollup's first fill of the year (reported, no target).

The requests go through the real views (DRF test client, the key's auth
included). It writes into its own tenant (`bench-billing-<random>`) and
deletes it after, unless --keep.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/llm_bench python benchmarks/billing_queries.py
    python benchmarks/billing_queries.py --records 500000 --rounds 20 --json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "platform_site.settings")
os.environ.setdefault("SECRET_KEY", "benchmark-only-secret-key-not-for-serving")

UTC = timezone.utc
YEAR_START = datetime(2025, 1, 1, tzinfo=UTC)


def _timed(run, rounds: int) -> list[float]:
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        run()
        samples.append((time.perf_counter() - started) * 1e3)
    return samples


def usage_year_generate(*, tenant, tier, keys, terms: dict, records: int, rng: random.Random, tag: str,
                        start: datetime, timings: bool = False) -> None:
    """`records` priced usage records of `tenant` spread evenly over the year from `start` (models: `terms`'
    keys, each with its PriceTerms). With `timings`, each has a time to first token and 2% end in an error."""
    from billing.models import UsageRecord
    from billing.money import cost_compute

    models = list(terms)  # in the caller's order (the same records for the same seed)
    milli = int(tier.price_multiplier * 1000)
    seconds = 365 * 86400
    batch = []
    for i in range(records):
        model = rng.choice(models)
        prompt = rng.randint(10, 4000)
        cached = rng.randint(0, prompt)
        completion = rng.randint(1, 800)
        cost = cost_compute(terms=terms[model], multiplier_milli=milli, prompt_tokens=prompt, cached_tokens=cached,
                            completion_tokens=completion)
        when = start + timedelta(seconds=seconds * i // records + rng.random())
        extra = {}
        if timings:
            error = rng.random() < 0.02
            extra = {"finish_reason": "error" if error else "stop",
                     "ttft_s": None if error else round(rng.lognormvariate(-1.5, 0.6), 4)}
        batch.append(UsageRecord(**{
            "request_id": f"{tag}-{i}", "tenant": tenant, "api_key": rng.choice(keys), "model": model,
            "tier": tier.name, "prompt_tokens": prompt, "cached_tokens": cached, "completion_tokens": completion,
            "finish_reason": "stop", "created_at": when, "admitted_at": when, "price_id": terms[model].price_id,
            "price_multiplier": tier.price_multiplier, "input_cost_femtos": cost.input,
            "cached_input_cost_femtos": cost.cached_input, "output_cost_femtos": cost.output,
            "cost_femtos": cost.total, **extra,
        }))
        if len(batch) == 5000:
            UsageRecord.objects.bulk_create(batch)
            batch = []
    UsageRecord.objects.bulk_create(batch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=500_000)
    parser.add_argument("--rounds", type=int, default=20, help="requests timed per API case (p50 reported)")
    parser.add_argument("--keep", action="store_true", help="leave the tenant and its records in the database")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    import django

    django.setup()
    from django.db import connection
    from rest_framework.test import APIClient

    from billing.models import HourlyUsage, Invoice, Price, UsageRecord
    from billing.periods import month_parse
    from billing.services.invoices import invoice_draft_refresh, invoice_finalize
    from billing.services.prices import EPOCH, price_create
    from billing.services.rollups import hourly_usage_fill
    from tenants.models import Tier
    from tenants.services.api_keys import api_key_create
    from tenants.services.tenants import tenant_create

    rng = random.Random(26)
    tag = uuid.uuid4().hex[:8]
    tier = Tier.objects.order_by("pk").first() or Tier.objects.create(name=f"bench-{tag}")
    tenant = tenant_create(slug=f"bench-billing-{tag}", name="billing benchmark", tier=tier)
    keys = [api_key_create(tenant=tenant, name=f"bench-{i}").api_key for i in range(20)]
    reader = api_key_create(tenant=tenant, name="reader", scopes=["usage:read"])
    models = [f"bench-{tag}-{name}" for name in ("small", "medium", "large")]
    prices = [price_create(model=model, input_per_million=p[0], cached_input_per_million=p[1],
                           output_per_million=p[2], effective_from=EPOCH)
              for model, p in zip(models, [("0.05", "0.025", "0.1"), ("0.5", "0.125", "1.5"), ("2.5", "0.25", "10")])]
    terms = {price.model: price.terms for price in prices}

    report: dict = {"database": connection.vendor, "records": args.records}
    started = time.perf_counter()
    usage_year_generate(tenant=tenant, tier=tier, keys=keys, terms=terms, records=args.records, rng=rng, tag=tag,
                        start=YEAR_START)
    report["generate_s"] = round(time.perf_counter() - started, 1)
    # a year of hours to roll up: the first fill of a fresh database, or late hours folded into a filled one
    started = time.perf_counter()
    hourly_usage_fill()
    report["rollup_fill_year_s"] = round(time.perf_counter() - started, 2)

    client = APIClient()
    auth = {"HTTP_AUTHORIZATION": f"Bearer {reader.key}"}
    august = int(datetime(2025, 8, 1, tzinfo=UTC).timestamp())

    def usage() -> None:
        response = client.get("/v1/organization/usage/completions", {
            "start_time": august, "bucket_width": "1d", "limit": 31, "group_by": "model"}, **auth)
        assert response.status_code == 200 and len(response.json()["data"]) == 31

    def costs() -> None:
        response = client.get("/v1/organization/costs", {"start_time": august, "limit": 31}, **auth)
        assert response.status_code == 200 and len(response.json()["data"]) == 31

    usage(), costs()  # warm: key cache, price cache, connections
    samples = {"usage_completions_31d_by_model_ms": _timed(usage, args.rounds),
               "costs_month_ms": _timed(costs, args.rounds)}
    for name, values in samples.items():
        report[name] = round(statistics.median(values), 2)

    period = month_parse(label="2025-08", tz=tenant.timezone)
    started = time.perf_counter()
    invoice = invoice_draft_refresh(tenant=tenant, period=period)
    invoice = invoice_finalize(invoice=invoice)
    report["invoice_close_month_s"] = round(time.perf_counter() - started, 3)
    report["invoice_lines"] = invoice.lines.count()
    if not args.keep:
        Invoice.objects.filter(tenant=tenant).delete()
        UsageRecord.objects.filter(tenant=tenant).delete()
        HourlyUsage.objects.filter(tenant=tenant).delete()
        Price.objects.filter(pk__in=[price.pk for price in prices]).delete()
        for key in keys:
            key.delete()
        reader.api_key.delete()
        tenant.delete()
    for name, value in report.items():
        print(f"{name:36s} {value}")
    if args.json:
        print(json.dumps(report))


if __name__ == "__main__":
    main()
