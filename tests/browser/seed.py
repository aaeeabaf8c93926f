"""Seeds the browser tests' server database (run as a script with the server's environment).

Two tenants on their own time zones, priced usage over the last ten days
(half of it rolled up, the rest only records), their invoice drafts, a
member and a viewer of `acme`, and prints what the tests need as JSON.
"""

from __future__ import annotations

import json
import os
import random
import sys
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "platform_site.settings")

import django  # noqa: E402

django.setup()

from django.utils import timezone  # noqa: E402

from billing.models import Price, UsageRecord  # noqa: E402
from billing.money import cost_compute, multiplier_to_milli  # noqa: E402
from billing.periods import month_containing  # noqa: E402
from billing.services.budgets import operator_budget_set  # noqa: E402
from billing.services.invoices import invoice_draft_refresh  # noqa: E402
from billing.services.rollups import hourly_usage_fill  # noqa: E402
from tenants.models import Tenant, Tier  # noqa: E402
from tenants.services.api_keys import api_key_create  # noqa: E402
from tenants.services.tenants import user_create_member  # noqa: E402

MODEL = "smollm2-135m-instruct"
PASSWORD = "browser-test-password-1"


def seed_tenant(slug: str, tz: str, rng: random.Random, now) -> Tenant:
    tier = Tier.objects.get(name="pro")
    tenant = Tenant.objects.create(slug=slug, name=slug.title(), tier=tier, timezone=tz)
    operator_budget_set(tenant=tenant, micros=50_000_000)
    keys = [api_key_create(tenant=tenant, name=f"{slug}-app-{i}").api_key for i in range(2)]
    price = Price.objects.filter(model=MODEL).order_by("-effective_from").first()
    milli = multiplier_to_milli(tier.price_multiplier)
    rows = []
    start = now - timedelta(days=10)
    for i in range(600):
        when = start + timedelta(seconds=rng.randint(0, 10 * 86400 - 60))
        prompt = rng.randint(10, 900)
        cached = rng.randint(0, prompt)
        completion = rng.randint(0, 300)
        error = rng.random() < 0.05
        cost = cost_compute(terms=price.terms, multiplier_milli=milli, prompt_tokens=prompt, cached_tokens=cached,
                            completion_tokens=completion)
        rows.append(UsageRecord(
            request_id=f"seed-{slug}-{i}", tenant=tenant, api_key=rng.choice(keys), model=MODEL, tier=tier.name,
            prompt_tokens=prompt, cached_tokens=cached, completion_tokens=completion,
            finish_reason="error" if error else "stop", ttft_s=None if error else round(rng.uniform(0.02, 1.5), 4),
            created_at=when, admitted_at=when, price=price, price_multiplier=tier.price_multiplier,
            input_cost_femtos=cost.input, cached_input_cost_femtos=cost.cached_input, output_cost_femtos=cost.output,
            cost_femtos=cost.total))
    UsageRecord.objects.bulk_create(rows)
    return tenant


def main() -> None:
    rng = random.Random(29)
    now = timezone.now()
    acme = seed_tenant("acme", "America/New_York", rng, now)
    globex = seed_tenant("globex", "Asia/Kolkata", rng, now)
    hourly_usage_fill(now=now - timedelta(days=4))
    invoices = {tenant.slug: invoice_draft_refresh(tenant=tenant, period=month_containing(instant=now,
                                                                                         tz=tenant.timezone)).public_id
                for tenant in (acme, globex)}
    users = {}
    for tenant, role in ((acme, "member"), (acme, "viewer"), (globex, "owner")):
        username = f"{tenant.slug}-{role}"
        user_create_member(tenant=tenant, username=username, role=role, password=PASSWORD)
        users[username] = PASSWORD
    print(json.dumps({
        "users": users, "invoices": invoices,
        "globex_key_id": globex.api_keys.order_by("pk").values_list("public_id", flat=True).first(),
    }))


if __name__ == "__main__":
    main()
