"""Migration 0005 gives every existing API key its own random public id, and the keys keep working."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

BEFORE = [("tenants", "0004_limit_overrides")]
AFTER = [("tenants", "0005_apikey_public_id")]


@pytest.mark.django_db(transaction=True)
def test_existing_keys_get_distinct_public_ids_and_still_verify():
    from tenants.services.api_keys import api_key_hash, api_key_verify

    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    old = executor.loader.project_state(BEFORE).apps
    tier = old.get_model("tenants", "Tier").objects.create(name="m-tier", allowed_models=["*"])
    tenant = old.get_model("tenants", "Tenant").objects.create(name="m", slug="m", tier=tier)
    secrets_ = {}
    for index in range(3):
        prefix, secret = f"sk-migrate{index:03d}", "S" * 40 + f"{index:03d}"
        old.get_model("tenants", "ApiKey").objects.create(
            tenant=tenant, name=f"k{index}", prefix=prefix, last_four=secret[-4:], secret_hash=api_key_hash(secret=secret))
        secrets_[prefix] = f"{prefix}-{secret}"

    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(AFTER)
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())

    from tenants.models import ApiKey

    public_ids = list(ApiKey.objects.filter(tenant__slug="m").values_list("public_id", flat=True))
    assert len(public_ids) == 3 and len(set(public_ids)) == 3
    assert all(pid.startswith("key_") and len(pid) == 24 for pid in public_ids)
    for prefix, key in secrets_.items():
        assert api_key_verify(key=key).api_key.prefix == prefix
