"""Two monthly budgets: the operator's cap (admin, `limits_set`) and the owners' own (dashboard); the lower applies.

Before the split one field served both, so an owner saving an empty budget on
the dashboard removed the cap an operator had set.
"""

from __future__ import annotations

import io
import uuid

import pytest
from asgiref.sync import async_to_sync
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from billing.counters import reset_admission_backend
from billing.counters.memory import MemoryAdmission
from billing.services.admission_reserve import aadmission_reserve
from billing.services.price_cache import price_cache_clear
from common.errors import InsufficientQuota
from billing.models import TenantBudget
from billing.services.budgets import (limits_explain, operator_budget_micros, owner_budget_micros,
                                      tenant_scope_limits)
from tenants.services.api_keys import AuthContext


@pytest.fixture
def budget_tenant(tenant_factory, tier_factory, price):
    """A tenant on a tier without other limits; `price` (tests/dashboard/conftest.py) prices model m-dash."""
    price_cache_clear()
    reset_admission_backend(MemoryAdmission())
    tier = tier_factory(requests_per_minute=0, tokens_per_minute=0, max_concurrent_requests=0, monthly_token_quota=0)
    yield tenant_factory(tier=tier)
    reset_admission_backend()
    price_cache_clear()


def _owner(tenant, member_factory) -> Client:
    client = Client()
    client.force_login(member_factory(tenant, "owner"))
    return client


def _save_budget(client, tenant, usd: str) -> None:
    assert client.post(reverse("dashboard:settings", args=[tenant.slug]), {"monthly_budget_usd": usd}).status_code == 302


def _budget_in_force(tenant) -> int:
    tenant.refresh_from_db()
    return tenant_scope_limits(tenant=tenant, tier=tenant.tier).monthly_spend_limit_micros


def _reserve(tenant, *, prompt: int, max_tokens: int):
    tenant.refresh_from_db()  # as the key's row is read again after a change
    auth = AuthContext(tenant=tenant, tier=tenant.tier, api_key=None)
    return async_to_sync(aadmission_reserve)(auth=auth, request_id=uuid.uuid4().hex, model="m-dash",
                                            prompt_tokens=prompt, max_tokens=max_tokens)


def test_an_owner_cannot_remove_or_lift_the_operators_cap(budget_tenant, member_factory):
    tenant = budget_tenant
    call_command("limits_set", "--tenant", tenant.slug, "--monthly-budget-usd", "10", stdout=io.StringIO())
    owner = _owner(tenant, member_factory)
    _save_budget(owner, tenant, "")  # "no budget of my own"
    tenant.refresh_from_db()
    assert operator_budget_micros(tenant=tenant) == 10_000_000 and owner_budget_micros(tenant=tenant) == 0
    assert _budget_in_force(tenant) == 10_000_000
    _save_budget(owner, tenant, "250")  # above the cap: the cap applies
    assert _budget_in_force(tenant) == 10_000_000
    row = next(row for row in limits_explain(tenant=tenant) if row.name == "monthly_spend_limit_micros")
    assert (row.effective, row.source) == (10_000_000, "operator")
    _save_budget(owner, tenant, "2.5")  # below it: the owners' own applies
    assert _budget_in_force(tenant) == 2_500_000
    row = next(row for row in limits_explain(tenant=tenant) if row.name == "monthly_spend_limit_micros")
    assert (row.effective, row.source) == (2_500_000, "owner")
    call_command("limits_set", "--tenant", tenant.slug, "--clear", "monthly-budget-usd", stdout=io.StringIO())
    assert _budget_in_force(tenant) == 2_500_000  # the operator's clear leaves the owners' budget alone


def test_the_settings_page_shows_both_and_edits_only_the_owners(budget_tenant, member_factory):
    tenant = budget_tenant
    TenantBudget.objects.create(tenant=tenant, monthly_spend_limit_micros=10_000_000, owner_spend_limit_micros=2_500_000)
    page = _owner(tenant, member_factory).get(reverse("dashboard:settings", args=[tenant.slug])).content.decode()
    assert 'id="operator-budget">10</td>' in page
    assert 'id="owner-budget">2.5</td>' in page and 'id="budget-in-force">2.5</td>' in page
    assert 'name="monthly_budget_usd" value="2.5"' in page  # the form holds the owners' own budget, not the cap


def test_admission_uses_the_lower_budget(budget_tenant, member_factory):
    """m-dash: $0.5/M input, $1.5/M output; 1000 + 1000 tokens cost at most $0.002 (2,000 micro-dollars)."""
    tenant = budget_tenant
    call_command("limits_set", "--tenant", tenant.slug, "--monthly-budget-usd", "0.001", stdout=io.StringIO())
    owner = _owner(tenant, member_factory)
    _save_budget(owner, tenant, "5")
    with pytest.raises(InsufficientQuota) as refused:
        _reserve(tenant, prompt=1000, max_tokens=1000)  # the operator's $0.001 binds, not the owners' $5
    assert "Limit $0.001" in refused.value.message
    call_command("limits_set", "--tenant", tenant.slug, "--monthly-budget-usd", "100", stdout=io.StringIO())
    _save_budget(owner, tenant, "0.001")
    with pytest.raises(InsufficientQuota):
        _reserve(tenant, prompt=1000, max_tokens=1000)  # now the owners' $0.001 binds
    _save_budget(owner, tenant, "")
    assert _reserve(tenant, prompt=1000, max_tokens=1000).reserved  # the operator's $100 only
