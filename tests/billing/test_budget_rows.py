"""Budgets are billing's (billing.models.TenantBudget): the request path reads none from the database, and a
change takes effect at once in this process (the verified-key cache is emptied, as for a tenant's columns)."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone

import pytest
from asgiref.sync import async_to_sync
from django.db import connection
from django.test.utils import CaptureQueriesContext

from billing.counters import reset_admission_backend
from billing.counters.memory import MemoryAdmission
from billing.models import TenantBudget
from billing.selectors import alert_percents
from billing.services.admission_reserve import aadmission_reserve
from billing.services.budgets import (budget_alert_percents_set, budget_loaded, operator_budget_set, owner_budget_set,
                                      tenant_budget_micros, tenant_budget_source)
from common.errors import InsufficientQuota
from tenants.services.api_keys import aapi_key_verify
from tenants.services.limits import LimitScope

MODEL = "m"
UNLIMITED = {"requests_per_minute": 0, "tokens_per_minute": 0, "max_concurrent_requests": 0, "monthly_token_quota": 0}


@pytest.fixture
def priced(price_factory):
    reset_admission_backend(MemoryAdmission())
    # 1000 prompt tokens at $1/M + 1000 output at $2/M: $0.003 (3,000 micro-dollars) at worst
    price_factory(model=MODEL, input="1", cached="0.5", output="2",
                  effective_from=datetime(2020, 1, 1, tzinfo=timezone.utc))
    yield
    reset_admission_backend()


async def _verify_and_reserve(key: str):
    """What a completion request does before it queues: verify the key (cached), then reserve its limits."""
    auth = await aapi_key_verify(key=key)
    return auth, await aadmission_reserve(auth=auth, request_id=uuid.uuid4().hex, model=MODEL, prompt_tokens=1000,
                                          max_tokens=1000)


def request(key: str):
    return async_to_sync(_verify_and_reserve)(key)


def test_a_warm_admission_reads_the_budget_without_a_query(priced, tenant_factory, tier_factory, api_key_factory):
    tenant = tenant_factory(tier=tier_factory(**UNLIMITED), monthly_spend_limit_micros=5_000)  # room for one
    key = api_key_factory(tenant=tenant).key
    auth, first = request(key)  # reads the key row (its tenant's budget with it), the prices; writes last_used_at
    assert first.reserved and budget_loaded(auth.tenant)
    with CaptureQueriesContext(connection) as queries:
        with pytest.raises(InsufficientQuota, match="monthly budget"):  # the budget applies...
            request(key)
    assert [q["sql"] for q in queries] == []  # ...and nothing was read from the database for it


def test_the_key_row_brings_the_budget_in_the_same_query(tenant_factory, api_key_factory):
    from tenants.services.api_keys import api_key_verify

    for fields in ({"owner_spend_limit_micros": 7}, {}):  # a row, and none (no budget): both known after the query
        key = api_key_factory(tenant=tenant_factory(**fields)).key
        api_key_verify(key=key)  # first use writes last_used_at
        with CaptureQueriesContext(connection) as queries:
            auth = api_key_verify(key=key)
            assert tenant_budget_micros(tenant=auth.tenant) == fields.get("owner_spend_limit_micros", 0)
        assert len(queries) == 1 and budget_loaded(auth.tenant)


def test_a_budget_change_applies_to_the_next_request_at_once(priced, tenant_factory, tier_factory, api_key_factory):
    tenant = tenant_factory(tier=tier_factory(**UNLIMITED))
    key = api_key_factory(tenant=tenant).key
    assert request(key)[1].reserved is False  # no limits at all: nothing to reserve
    operator_budget_set(tenant=tenant, micros=1_000)  # below one worst case: refused
    with pytest.raises(InsufficientQuota):
        request(key)
    operator_budget_set(tenant=tenant, micros=0)
    owner_budget_set(tenant=tenant, micros=100_000)
    assert request(key)[1].reserved
    TenantBudget.objects.filter(tenant=tenant).delete()  # (a queryset's delete signals each row too)
    assert request(key)[1].reserved is False
    TenantBudget.objects.create(tenant=tenant, owner_spend_limit_micros=1)  # a new row: refused at once
    with pytest.raises(InsufficientQuota):
        request(key)
    TenantBudget.objects.get(tenant=tenant).delete()  # no row: no budget
    assert request(key)[1].reserved is False


def test_the_lower_budget_applies_and_the_operators_wins_a_tie(tenant_factory):
    tenant = tenant_factory()
    assert (tenant_budget_micros(tenant=tenant), tenant_budget_source(tenant=tenant)) == (0, "none")
    owner_budget_set(tenant=tenant, micros=300)
    assert (tenant_budget_micros(tenant=tenant), tenant_budget_source(tenant=tenant)) == (300, "owner")
    operator_budget_set(tenant=tenant, micros=200)
    assert (tenant_budget_micros(tenant=tenant), tenant_budget_source(tenant=tenant)) == (200, "operator")
    owner_budget_set(tenant=tenant, micros=200)
    assert tenant_budget_source(tenant=tenant) == "operator"
    with pytest.raises(ValueError):
        owner_budget_set(tenant=tenant, micros=-1)
    row = TenantBudget.objects.get(tenant=tenant)
    assert (row.monthly_spend_limit_micros, row.owner_spend_limit_micros) == (200, 200)


def test_alert_thresholds_change_at_once_here(tenant_factory, settings, api_key_factory):
    tenant = tenant_factory()
    key = api_key_factory(tenant=tenant).api_key
    platform = tuple(sorted(settings.BUDGET_ALERT_PERCENTS))
    assert alert_percents(LimitScope.tenant(tenant.pk)) == platform  # no row: the platform's
    assert alert_percents(LimitScope.key(key.pk)) == platform
    assert budget_alert_percents_set(tenant=tenant, percents=[90, 20, 90]) == [20, 90]
    assert alert_percents(LimitScope.tenant(tenant.pk)) == (20, 90)  # the save forgot the kept thresholds
    assert alert_percents(LimitScope.key(key.pk)) == (20, 90)
    with pytest.raises(ValueError):
        budget_alert_percents_set(tenant=tenant, percents=[0])


def test_the_admin_shows_the_cap_and_its_inline(admin_client, tenant_factory):
    tenant = tenant_factory(monthly_spend_limit_micros=12_500_000, owner_spend_limit_micros=2_000_000)
    listing = admin_client.get("/admin/tenants/tenant/").content.decode()
    assert "$12.50" in listing  # the operator's cap, as before
    page = admin_client.get(f"/admin/tenants/tenant/{tenant.pk}/change/").content.decode()
    assert 'name="budget-0-monthly_spend_limit_micros"' in page  # the operator sets the cap here
    assert 'name="budget-0-owner_spend_limit_micros"' not in page  # the owners' own: shown, not editable
    assert "<td>monthly_spend_limit_micros</td><td>-</td><td>2000000</td><td><b>2000000</b></td><td>owner</td>" in page
