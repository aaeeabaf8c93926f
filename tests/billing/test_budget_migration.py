"""billing 0011 + tenants 0009: the budget columns move from tenants.Tenant to billing.TenantBudget with their
values, and back (both migrations are reversible), on a database with tenants in it."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

BEFORE = [("billing", "0010_invoice_public_id"), ("tenants", "0008_apikey_lineage")]
AFTER = [("billing", "0011_tenant_budget"), ("tenants", "0009_budgets_to_billing")]
FIELDS = ("monthly_spend_limit_micros", "owner_spend_limit_micros", "budget_alert_percents")
# slug -> (operator's cap, owners' own, alert percents); "plain" has none: it gets no budget row
TENANTS = {"capped": (10_000_000, 0, []), "owned": (0, 2_500_000, [25, 90]), "both": (5_000_000, 7_000_000, [50]),
           "alerts-only": (0, 0, [10, 20]), "plain": (0, 0, [])}


def _migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


@pytest.mark.django_db(transaction=True)
def test_the_budgets_move_to_billing_and_back():
    try:
        apps = _migrate(BEFORE)
        Tier, Tenant = apps.get_model("tenants", "Tier"), apps.get_model("tenants", "Tenant")
        tier = Tier.objects.create(name="migration-tier")
        for slug, values in TENANTS.items():
            Tenant.objects.create(slug=slug, name=slug, tier=tier, **dict(zip(FIELDS, values)))

        apps = _migrate(AFTER)
        Tenant, TenantBudget = apps.get_model("tenants", "Tenant"), apps.get_model("billing", "TenantBudget")
        assert not any(hasattr(Tenant, name) for name in FIELDS)  # the columns are gone from tenants
        moved = {row.tenant.slug: tuple(getattr(row, name) for name in FIELDS)
                 for row in TenantBudget.objects.select_related("tenant")}
        assert moved == {slug: values for slug, values in TENANTS.items() if slug != "plain"}
        budget = TenantBudget.objects.get(tenant__slug="both")
        budget.owner_spend_limit_micros = 3_000_000  # changed after the move: the way back carries it
        budget.save()

        apps = _migrate(BEFORE)
        Tenant = apps.get_model("tenants", "Tenant")
        back = {tenant.slug: tuple(getattr(tenant, name) for name in FIELDS) for tenant in Tenant.objects.all()}
        assert back == {**TENANTS, "both": (5_000_000, 3_000_000, [50])}
        assert "billing_tenantbudget" not in connection.introspection.table_names()
    finally:
        _migrate(_leaf_nodes())  # every app at its latest again, for the tests after this one


def _leaf_nodes():
    executor = MigrationExecutor(connection)
    return executor.loader.graph.leaf_nodes()
