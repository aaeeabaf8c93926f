"""UsageRecord moved from tenants to billing without touching its table: rows written before survive."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

BEFORE = [("billing", None), ("tenants", "0001_initial")]
AFTER = [("tenants", "0002_usagerecord_to_billing"), ("billing", "0001_initial")]


@pytest.mark.django_db(transaction=True)
def test_rows_written_under_tenants_are_read_through_billing():
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    old = MigrationExecutor(connection).loader.project_state([("tenants", "0001_initial")]).apps
    tier = old.get_model("tenants", "Tier").objects.create(name="move-tier")
    tenant = old.get_model("tenants", "Tenant").objects.create(name="Move", slug="move", tier=tier)
    old.get_model("tenants", "UsageRecord").objects.create(
        request_id="moved-1", tenant=tenant, model="m", tier="move-tier", prompt_tokens=5, completion_tokens=3,
        finish_reason="stop",
    )
    executor = MigrationExecutor(connection)
    executor.migrate(AFTER)
    new = MigrationExecutor(connection).loader.project_state(AFTER).apps
    record = new.get_model("billing", "UsageRecord").objects.get(request_id="moved-1")
    assert (record.tenant_id, record.prompt_tokens, record.completion_tokens) == (tenant.pk, 5, 3)
    MigrationExecutor(connection).migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())
