"""Writing usage records: one request at a time against one insert per engine step.

A worker ends requests in batches (the requests one engine step finished); this
measures what their records cost the finisher thread, per record, on the
database in DATABASE_URL (migrated), in the same run:

- one at a time: `usage_record_create` (a key check, then get_or_create in a
  transaction: five or six round trips per record);
- batched: `usage_records_insert` (one `INSERT ... SELECT ... ON CONFLICT DO
  NOTHING`, the keys' check a join in it: billing.services.usage_sql), at
  batch sizes 1 and --batch.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/llm_api_bench python benchmarks/usage_records.py
    python benchmarks/usage_records.py --records 640 --rounds 5 --json

It writes into its own tenant ("bench-usage-<random>") and deletes it after.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _compare import medians_against  # noqa: E402
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "platform_site.settings")
os.environ.setdefault("SECRET_KEY", "benchmark-only-secret-key-not-for-serving")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=320, help="records per measurement")
    parser.add_argument("--batch", type=int, default=16, help="records per insert (a step's finished requests)")
    parser.add_argument("--rounds", type=int, default=3, help="measurements of each; medians are reported")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    import django

    django.setup()
    from django.db import connection

    from billing.models import UsageRecord
    from billing.services.prices import EPOCH, price_create
    from billing.services.usage import usage_record_create, usage_records_insert
    from tenants.models import Tier
    from tenants.services.api_keys import api_key_create
    from tenants.services.tenants import tenant_create

    tier = Tier.objects.order_by("pk").first() or Tier.objects.create(name=f"bench-{uuid.uuid4().hex[:6]}")
    tenant = tenant_create(slug=f"bench-usage-{uuid.uuid4().hex[:8]}", name="usage records benchmark", tier=tier)
    key = api_key_create(tenant=tenant, name="bench").api_key
    # a priced model of its own, so every record is costed as the worker's are
    model = f"bench-{uuid.uuid4().hex[:8]}"
    price = price_create(model=model, input_per_million="0.15", cached_input_per_million="0.075",
                         output_per_million="0.6", effective_from=EPOCH)

    def fields() -> dict:
        return dict(request_id=uuid.uuid4().hex, tenant_id=tenant.pk, api_key_id=key.pk, model=model,
                    tier=tier.name, endpoint="chat.completions", prompt_tokens=150, cached_tokens=0,
                    completion_tokens=64, finish_reason="length", queued_s=0.01, ttft_s=0.1, duration_s=3.0,
                    worker_id="bench", admitted_at=time.time())

    def one_at_a_time() -> None:
        for _ in range(args.records):
            usage_record_create(**fields())

    def batched(size: int):
        def run() -> None:
            for _ in range(args.records // size):
                usage_records_insert([fields() for _ in range(size)])
        return run

    cases = {"one at a time (usage_record_create)": (one_at_a_time, args.records),
             "batch of 1 (usage_records_insert)": (batched(1), args.records),
             f"batch of {args.batch} (usage_records_insert)": (batched(args.batch), args.records // args.batch * args.batch)}
    samples: dict[str, list[float]] = {name: [] for name in cases}
    try:
        for _ in range(args.rounds):  # interleaved, so drifting load hits every case alike
            for name, (run, count) in cases.items():
                started = time.perf_counter()
                run()
                samples[name].append((time.perf_counter() - started) / count * 1e3)
    finally:
        UsageRecord.objects.filter(tenant=tenant).delete()
        price.delete()
        key.delete()
        tenant.delete()
    medians, speedup = medians_against(samples, "one at a time (usage_record_create)", unit="ms/record",
                                       prefix=f"{connection.vendor:10s} ")
    report = {"database": connection.vendor, "records": args.records, "rounds": args.rounds,
              "ms_per_record": medians, "speedup": speedup}
    if args.json:
        print(json.dumps(report))


if __name__ == "__main__":
    main()
