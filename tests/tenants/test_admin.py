"""Admin: every registered model's pages load for a superuser; actions work; no secrets shown."""

import re

import pytest
from django.contrib import admin
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.auth import get_user_model
from django.urls import reverse

from billing.models import UsageRecord
from inference.models import ServedModel
from tenants.models import ApiKey, Membership, Tenant
from tests.conftest import bearer

KEY_RE = re.compile(r"sk-[a-z0-9]{10}-[A-Za-z0-9]{43}")


@pytest.fixture
def admin_client(client, db):
    user = get_user_model().objects.create_superuser("root", "root@example.com", "a-long-test-password-1")
    client.force_login(user)
    client.user = user
    return client


@pytest.fixture
def populated(admin_client, api_key, tenant, served_model):
    Membership.objects.create(user=admin_client.user, tenant=tenant, role="owner")
    UsageRecord.objects.create(
        request_id="req-1", tenant=tenant, api_key=api_key.api_key, model=served_model.name, tier=tenant.tier.name,
        prompt_tokens=10, completion_tokens=5, finish_reason="stop", duration_s=0.5,
    )
    return api_key


def _url(model, name, *args):
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_{name}", args=args)


def test_every_registered_model_loads(admin_client, populated):
    secret_hash = populated.api_key.secret_hash
    assert {ApiKey, Tenant, Membership, UsageRecord, ServedModel} <= set(admin.site._registry)
    for model, model_admin in admin.site._registry.items():
        changelist = admin_client.get(_url(model, "changelist"))
        assert changelist.status_code == 200, model
        assert secret_hash not in changelist.content.decode()
        searched = admin_client.get(_url(model, "changelist"), {"q": "x"})
        assert searched.status_code == 200, model
        obj = model._default_manager.first()
        if obj is not None:
            page = admin_client.get(_url(model, "change", obj.pk))
            assert page.status_code == 200, model
            assert secret_hash not in page.content.decode()
        if model_admin.has_add_permission(admin_client.get("/").wsgi_request):
            assert admin_client.get(_url(model, "add")).status_code == 200, model
    assert admin_client.get("/admin/").status_code == 200


def test_changelist_filters(admin_client, populated):
    for status in ("active", "revoked", "expired"):
        assert admin_client.get(_url(ApiKey, "changelist"), {"status": status}).status_code == 200
    assert admin_client.get(_url(Tenant, "changelist"), {"status__exact": "active"}).status_code == 200


def test_api_key_pages_never_show_the_hash(admin_client, populated):
    page = admin_client.get(_url(ApiKey, "change", populated.api_key.pk)).content.decode()
    assert "secret_hash" not in page and populated.api_key.secret_hash not in page
    assert populated.api_key.redacted in admin_client.get(_url(ApiKey, "changelist")).content.decode()


def test_admin_creates_key_shown_once(admin_client, api_client, tenant, served_model):
    response = admin_client.post(_url(ApiKey, "add"), {"tenant": tenant.pk, "name": "from-admin", "scopes": ["inference"]})
    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"]
    keys = KEY_RE.findall(response.content.decode())
    assert len(set(keys)) == 1
    row = ApiKey.objects.get(name="from-admin")
    assert row.created_by == admin_client.user and row.scopes == ["inference"]
    assert api_client.get("/v1/models", **bearer(keys[0])).status_code == 200
    for url in (_url(ApiKey, "change", row.pk), _url(ApiKey, "changelist")):
        assert keys[0] not in admin_client.get(url).content.decode()


def test_revoke_action(admin_client, api_client, populated, served_model):
    assert api_client.get("/v1/models", **bearer(populated.key)).status_code == 200
    response = admin_client.post(_url(ApiKey, "changelist"), {"action": "revoke", ACTION_CHECKBOX_NAME: [populated.api_key.pk]})
    assert response.status_code == 302
    assert ApiKey.objects.get(pk=populated.api_key.pk).revoked_at is not None
    assert api_client.get("/v1/models", **bearer(populated.key)).status_code == 401


def test_suspend_and_reactivate_actions(admin_client, api_client, populated, tenant):
    url = _url(Tenant, "changelist")
    assert admin_client.post(url, {"action": "suspend", ACTION_CHECKBOX_NAME: [tenant.pk]}).status_code == 302
    assert Tenant.objects.get(pk=tenant.pk).status == "suspended"
    assert api_client.get("/v1/models", **bearer(populated.key)).status_code == 403
    assert admin_client.post(url, {"action": "reactivate", ACTION_CHECKBOX_NAME: [tenant.pk]}).status_code == 302
    assert Tenant.objects.get(pk=tenant.pk).status == "active"
    assert api_client.get("/v1/models", **bearer(populated.key)).status_code == 200


def test_change_tier_action(admin_client, tenant_factory, tier_factory):
    gold = tier_factory(name="gold")
    tenants = [tenant_factory(), tenant_factory()]
    url = _url(Tenant, "changelist")
    selected = {"action": "change_tier", ACTION_CHECKBOX_NAME: [t.pk for t in tenants]}
    form_page = admin_client.post(url, selected)
    assert form_page.status_code == 200 and b"Change tier" in form_page.content
    assert all(t.slug.encode() in form_page.content for t in tenants)
    response = admin_client.post(url, {**selected, "apply": "1", "tier": gold.pk})
    assert response.status_code == 302
    assert {t.tier.name for t in Tenant.objects.filter(pk__in=[t.pk for t in tenants])} == {"gold"}


def test_served_model_actions(admin_client, served_model):
    url = _url(ServedModel, "changelist")
    admin_client.post(url, {"action": "disable", ACTION_CHECKBOX_NAME: [served_model.pk]})
    assert not ServedModel.objects.get(pk=served_model.pk).enabled
    admin_client.post(url, {"action": "enable", ACTION_CHECKBOX_NAME: [served_model.pk]})
    assert ServedModel.objects.get(pk=served_model.pk).enabled


def test_tier_rejects_malformed_allowed_models(admin_client, tier):
    from tenants.models import Tier

    data = {f.name: getattr(tier, f.name) for f in Tier._meta.fields if f.name != "id"}
    data["allowed_models"] = '{"not": "a list"}'
    response = admin_client.post(_url(Tier, "change", tier.pk), data)
    assert response.status_code == 200 and b"A list of model names" in response.content


def test_api_key_admin_links_use_public_ids(admin_client, populated):
    key = populated.api_key
    listing = admin_client.get(_url(ApiKey, "changelist")).content.decode()
    assert _url(ApiKey, "change", key.public_id) in listing and _url(ApiKey, "change", key.pk) not in listing
    page = admin_client.get(_url(ApiKey, "change", key.public_id))
    assert page.status_code == 200 and key.public_id in page.content.decode()
    assert admin_client.get(_url(ApiKey, "change", "key_" + "0" * 20)).status_code == 302  # unknown: back to the list
