"""Management commands: bootstrap (idempotent), create_tenant, create_api_key, revoke_api_key."""

import io
import json
import re

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from inference.models import ServedModel
from tenants.models import ApiKey, Membership, Tenant, Tier
from tenants.services.api_keys import api_key_verify
from tests.tenants.dbdump import dump_tables

KEY_RE = re.compile(r"sk-[a-z0-9]{10}-[A-Za-z0-9]{43}")


def run(*args, **options) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, **options)
    return out.getvalue()


def without_keys(dump: dict) -> dict:
    return {table: rows for table, rows in dump.items() if table != ApiKey._meta.db_table}


def test_bootstrap_creates_everything(db):
    out = run("bootstrap", admin_password="a-long-admin-password-1")
    assert {t.name: t.priority for t in Tier.objects.all()} == {"enterprise": 0, "pro": 1, "free": 2}
    weights = {t.name: t.queue_weight for t in Tier.objects.all()}
    assert weights["free"] < weights["pro"] < weights["enterprise"]
    assert Tier.objects.get(name="free").allowed_models == ["smollm2-135m-instruct"]
    assert Tier.objects.get(name="enterprise").allowed_models == ["*"]
    model = ServedModel.objects.get(name="smollm2-135m-instruct")
    assert model.enabled and model.context_length == 8192 and "SmolLM2-135M-Instruct.Q4_1.gguf" in model.source
    demo = Tenant.objects.get(slug="demo")
    admin = get_user_model().objects.get(username="admin")
    assert admin.is_superuser and admin.check_password("a-long-admin-password-1")
    assert Membership.objects.get(user=admin, tenant=demo).role == "owner"
    keys = KEY_RE.findall(out)
    assert len(set(keys)) == 1
    context = api_key_verify(key=keys[0])
    assert context.tenant == demo
    assert "a-long-admin-password-1" not in out  # given passwords are not echoed


def test_bootstrap_twice_changes_nothing_but_adds_a_key(db):
    first = run("bootstrap", admin_password="a-long-admin-password-1")
    before = dump_tables(exclude_tables=("django_session",))
    second = run("bootstrap", admin_password="a-different-password-2")
    after = dump_tables(exclude_tables=("django_session",))
    assert without_keys(after) == without_keys(before)
    table = ApiKey._meta.db_table
    assert set(before[table]) <= set(after[table]) and len(after[table]) == len(before[table]) + 1
    assert "nothing" in second
    key1, key2 = KEY_RE.findall(first)[0], KEY_RE.findall(second)[0]
    assert key1 != key2
    assert api_key_verify(key=key1).tenant == api_key_verify(key=key2).tenant
    assert get_user_model().objects.get(username="admin").check_password("a-long-admin-password-1")


def test_bootstrap_password_from_env_or_generated(db, settings):
    settings.BOOTSTRAP_ADMIN_PASSWORD = "env-password-long-enough"  # what $ADMIN_PASSWORD sets
    run("bootstrap")
    assert get_user_model().objects.get(username="admin").check_password("env-password-long-enough")
    settings.BOOTSTRAP_ADMIN_PASSWORD = None
    out = run("bootstrap", admin_username="ops")
    password = re.search(r"user ops  password (\S+)", out).group(1)
    assert get_user_model().objects.get(username="ops").check_password(password)
    again = run("bootstrap", admin_username="ops")
    assert password not in again and "password unchanged" in again


def test_bootstrap_keeps_operator_edits(db):
    run("bootstrap", admin_password="a-long-admin-password-1")
    Tier.objects.filter(name="free").update(requests_per_minute=7)
    run("bootstrap")
    assert Tier.objects.get(name="free").requests_per_minute == 7


def test_create_tenant(db):
    run("bootstrap", admin_password="a-long-admin-password-1")
    out = run("create_tenant", slug="acme", name="Acme Inc", tier="enterprise")
    tenant = Tenant.objects.get(slug="acme")
    assert tenant.name == "Acme Inc" and tenant.tier.name == "enterprise" and "acme" in out
    with pytest.raises(CommandError, match="already exists"):
        run("create_tenant", slug="acme", name="again", tier="free")
    with pytest.raises(CommandError, match="Unknown tier"):
        run("create_tenant", slug="other", tier="platinum")
    with pytest.raises(CommandError, match="Invalid slug"):
        run("create_tenant", slug="Not A Slug", tier="free")


def test_create_api_key_json(tenant):
    out = run("create_api_key", "--tenant", tenant.slug, "--name", "ci", "--json")
    payload = json.loads(out)
    assert set(payload) == {"key", "tenant", "id"}
    assert payload["tenant"] == tenant.slug and KEY_RE.fullmatch(payload["key"])
    assert api_key_verify(key=payload["key"]).api_key.public_id == payload["id"]


def test_create_api_key_plain_and_scoped(tenant):
    out = run("create_api_key", "--tenant", tenant.slug, "--name", "ro", "--scopes", "usage:read", "--expires-days", "3")
    key = KEY_RE.findall(out)[0]
    row = api_key_verify(key=key).api_key
    assert row.scopes == ["usage:read"] and row.expires_at is not None
    with pytest.raises(CommandError, match="Unknown tenant"):
        run("create_api_key", "--tenant", "missing", "--name", "x")
    with pytest.raises(CommandError, match="Unknown scope"):
        run("create_api_key", "--tenant", tenant.slug, "--name", "x", "--scopes", "root")


@pytest.mark.parametrize("how", ["id", "prefix", "full", "positional-id"])
def test_revoke_api_key(api_key, how):
    row = api_key.api_key
    args = {"id": ["--id", str(row.pk)], "prefix": ["--prefix", row.prefix], "full": [api_key.key],
            "positional-id": [str(row.pk)]}[how]
    out = run("revoke_api_key", *args)
    assert "revoked" in out and row.redacted in out
    assert ApiKey.objects.get(pk=row.pk).revoked_at is not None
    assert "already revoked" in run("revoke_api_key", *args)


def test_revoke_api_key_errors(db):
    with pytest.raises(CommandError):
        run("revoke_api_key", "sk-nothere000")
    with pytest.raises(CommandError):
        run("revoke_api_key")
    with pytest.raises(CommandError):
        run("revoke_api_key", "12", "--prefix", "sk-x")
