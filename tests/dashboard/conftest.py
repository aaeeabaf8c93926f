"""Dashboard fixtures: priced usage records for a tenant, and users with a role in it."""

from __future__ import annotations

import itertools
import random
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone

import pytest

UTC = dt_timezone.utc
_seq = itertools.count(1)


@pytest.fixture
def price(db):
    from billing.services.prices import EPOCH, price_create

    return price_create(model="m-dash", input_per_million="0.5", cached_input_per_million="0.125",
                        output_per_million="1.5", effective_from=EPOCH)


@pytest.fixture
def seed_usage(price):
    """seed_usage(tenant, start, hours, per_hour=3, keys=(), seed=1) -> the records (priced, some errors)."""
    from billing.models import UsageRecord
    from billing.money import cost_compute

    def make(tenant, *, start: datetime, hours: int, per_hour: int = 3, keys=(), seed: int = 1, model="m-dash"):
        rng = random.Random(seed)
        rows = []
        for hour in range(hours):
            for i in range(per_hour):
                when = start + timedelta(hours=hour, seconds=rng.randint(0, 3599))
                prompt = rng.randint(5, 400)
                cached = rng.randint(0, prompt)
                completion = rng.randint(0, 200)
                error = rng.random() < 0.1
                cost = cost_compute(terms=price.terms, multiplier_milli=1000, prompt_tokens=prompt,
                                    cached_tokens=cached, completion_tokens=completion)
                rows.append(UsageRecord(
                    request_id=f"dash-{next(_seq)}", tenant=tenant, api_key=rng.choice(keys) if keys else None,
                    model=model, tier=tenant.tier.name, prompt_tokens=prompt, cached_tokens=cached,
                    completion_tokens=completion, finish_reason="error" if error else "stop",
                    ttft_s=None if error else round(rng.uniform(0.01, 2.0), 4), created_at=when, admitted_at=when,
                    price=price, input_cost_femtos=cost.input, cached_input_cost_femtos=cost.cached_input,
                    output_cost_femtos=cost.output, cost_femtos=cost.total,
                ))
        UsageRecord.objects.bulk_create(rows)
        return rows

    return make


@pytest.fixture
def member_factory(db):
    """member(tenant, role) -> a User with that role in the tenant (password "pw-dashboard-1")."""
    from tenants.services.tenants import user_create_member

    def make(tenant, role: str = "member"):
        return user_create_member(tenant=tenant, username=f"user-{next(_seq)}", role=role,
                                  password="pw-dashboard-1-long")

    return make


@pytest.fixture(autouse=True)
def _models_filter_forgotten():
    """Tenant ids come back across tests: no test sees another's cached model list."""
    from dashboard.selectors.usage import _models_used

    _models_used.clear()
    yield
    _models_used.clear()
