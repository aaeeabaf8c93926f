"""Billing fixtures: price versions and usage records written the way the worker writes them."""

import itertools
from datetime import datetime, timezone

import pytest

_seq = itertools.count(1)
T0 = datetime(2026, 3, 1, tzinfo=timezone.utc)


@pytest.fixture(autouse=True)
def _fresh_price_cache():
    from billing.services.price_cache import price_cache_clear

    price_cache_clear()
    yield
    price_cache_clear()


@pytest.fixture
def price_factory(db):
    """make(model="m", input="1", cached="0.5", output="2", effective_from=T0) -> Price (first versions may start any time)."""
    from billing.models import Price

    def make(model: str = "m", input: str = "1", cached: str = "0.5", output: str = "2", effective_from=T0):
        # straight to the table: tests place versions anywhere in time; price_create's lead rule is tested apart
        return Price.objects.create(model=model, input_per_million=input, cached_input_per_million=cached,
                                    output_per_million=output, effective_from=effective_from)

    return make


@pytest.fixture
def record_write(db):
    """write(tenant, **fields) -> UsageRecord, through usage_records_insert as the worker writes it."""
    from billing.models import UsageRecord
    from billing.services.usage import usage_records_insert

    def write(tenant, api_key=None, **overrides):
        fields = dict(
            request_id=f"req-{next(_seq)}", tenant_id=tenant.pk, api_key_id=api_key.pk if api_key else None,
            model="m", tier=tenant.tier.name, prompt_tokens=1000, cached_tokens=0, completion_tokens=100,
            finish_reason="stop", admitted_at=T0,
        )
        fields.update(overrides)
        usage_records_insert([fields])
        return UsageRecord.objects.get(request_id=fields["request_id"])

    return write
