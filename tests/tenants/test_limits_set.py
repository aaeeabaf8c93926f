"""`manage.py limits_set` and the effective limits it reports (tier, tenant override, key ceiling)."""

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from billing.models import TenantBudget
from billing.services.budgets import limits_explain


def cap(tenant) -> int:
    """The operator's budget cap, from the database (billing.models.TenantBudget; no row: none)."""
    row = TenantBudget.objects.filter(tenant=tenant).first()
    return row.monthly_spend_limit_micros if row else 0


def run(*args) -> str:
    out = StringIO()
    call_command("limits_set", *args, stdout=out)
    return out.getvalue()


def effective(tenant, api_key=None) -> dict:
    return {row.name: (row.effective, row.source) for row in limits_explain(tenant=tenant, api_key=api_key)}


def test_tenant_overrides_key_ceilings_and_clearing(tenant_factory, tier_factory, api_key_factory):
    tenant = tenant_factory(slug="acme", tier=tier_factory(requests_per_minute=60, tokens_per_minute=40_000))
    key = api_key_factory(tenant=tenant).api_key
    out = run("--tenant", "acme", "--rpm", "3", "--monthly-budget-usd", "12.50", "--monthly-token-quota", "0")
    assert "requests_per_minute" in out and "from tenant" in out
    tenant.refresh_from_db()
    assert (tenant.requests_per_minute, cap(tenant), tenant.monthly_token_quota) == (3, 12_500_000, 0)
    assert effective(tenant)["monthly_spend_limit_micros"] == (12_500_000, "operator")
    assert effective(tenant)["requests_per_minute"] == (3, "tenant")
    assert effective(tenant)["tokens_per_minute"] == (40_000, "tier")
    assert effective(tenant)["monthly_token_quota"] == (0, "none")

    run("--tenant", "acme", "--key", key.prefix, "--rpm", "2", "--tpm", "90000", "--monthly-budget-usd", "1")
    key.refresh_from_db()
    assert (key.requests_per_minute, key.tokens_per_minute, key.monthly_spend_limit_micros) == (2, 90_000, 1_000_000)
    rows = effective(tenant, key)
    assert rows["requests_per_minute"] == (2, "key")  # the stricter wins
    assert rows["tokens_per_minute"] == (40_000, "tier")  # the key's higher ceiling does not lift the tenant's
    assert rows["monthly_spend_limit_micros"] == (1_000_000, "key")

    run("--tenant", "acme", "--clear", "rpm", "monthly-budget-usd")
    tenant.refresh_from_db()
    assert tenant.requests_per_minute is None and cap(tenant) == 0
    run("--tenant", "acme", "--key", key.prefix, "--clear", "rpm")
    key.refresh_from_db()
    assert key.requests_per_minute is None


def test_bad_input_is_refused(tenant_factory):
    tenant_factory(slug="acme")
    for args in (["--tenant", "nope", "--rpm", "1"], ["--tenant", "acme", "--key", "sk-nope", "--rpm", "1"],
                 ["--tenant", "acme", "--rpm", "-1"], ["--tenant", "acme", "--monthly-budget-usd", "0.0000001"],
                 ["--tenant", "acme", "--rpm", "1", "--clear", "rpm"]):
        with pytest.raises(CommandError):
            run(*args)


def test_the_admin_shows_the_effective_limits(admin_client, tenant_factory, tier_factory, api_key_factory):
    tenant = tenant_factory(tier=tier_factory(requests_per_minute=60), requests_per_minute=5)
    key = api_key_factory(tenant=tenant).api_key
    key.requests_per_minute = 2
    key.save()
    page = admin_client.get(f"/admin/tenants/tenant/{tenant.pk}/change/").content.decode()
    assert "Effective limits" in page and "<td>requests_per_minute</td><td>60</td><td>5</td><td><b>5</b></td><td>tenant</td>" in page
    page = admin_client.get(f"/admin/tenants/apikey/{key.pk}/change/").content.decode()
    assert "<td>requests_per_minute</td><td>60</td><td>2</td><td><b>2</b></td><td>key</td>" in page
    assert 'name="requests_per_minute"' in page  # editable there


def test_setting_a_limit_writes_only_the_limits_it_names(tenant_factory, tier_factory):
    """A dashboard owner's budget change must not write back a stale copy of the row: an operator's tier change
    (or suspension) made meanwhile stays."""
    from billing.services.budgets import limits_set
    from tenants.models import Tenant

    tenant = tenant_factory(tier=tier_factory(name="free-x"))
    stale = Tenant.objects.get(pk=tenant.pk)  # the dashboard's copy, loaded at the start of its request
    Tenant.objects.filter(pk=tenant.pk).update(tier=tier_factory(name="pro-x"), status="suspended")
    limits_set(tenant=stale, values={"monthly_spend_limit_micros": 5_000_000})
    tenant.refresh_from_db()
    assert (tenant.tier.name, tenant.status, cap(tenant)) == ("pro-x", "suspended", 5_000_000)
    limits_set(tenant=stale, values={"requests_per_minute": 7})  # a rate limit: the tenant's row, that column only
    tenant.refresh_from_db()
    assert (tenant.tier.name, tenant.status, tenant.requests_per_minute, cap(tenant)) == ("pro-x", "suspended", 7,
                                                                                          5_000_000)


def test_tenants_limits_set_leaves_the_budget_to_billing(tenant_factory):
    """tenants' own limits_set knows no budget of a tenant's (billing's); a key's budget is the key's column."""
    from tenants.services.limits import limits_set

    with pytest.raises(ValueError, match="unknown limit"):
        limits_set(tenant=tenant_factory(), values={"monthly_spend_limit_micros": 1})
