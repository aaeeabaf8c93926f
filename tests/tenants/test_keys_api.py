"""/v1/keys: list, create (secret once), revoke; strict tenant isolation; scopes."""

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from tenants.models import ApiKey
from tests.conftest import bearer

PUBLIC_FIELDS = {"id", "object", "name", "prefix", "redacted_value", "scopes", "status", "created_at",
                 "expires_at", "revoked_at", "last_used_at"}


@pytest.fixture
def two_tenants(api_key_factory, tenant_factory):
    a, b = tenant_factory(slug="acme"), tenant_factory(slug="globex")
    return {
        "a": api_key_factory(tenant=a, name="a-admin"),
        "a2": api_key_factory(tenant=a, name="a-second"),
        "b": api_key_factory(tenant=b, name="b-admin"),
    }


def test_list_shows_only_own_tenant_and_never_secrets(api_client, two_tenants):
    response = api_client.get("/v1/keys", **bearer(two_tenants["a"].key))
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "list"
    assert {item["name"] for item in body["data"]} == {"a-admin", "a-second"}
    for item in body["data"]:
        assert set(item) == PUBLIC_FIELDS
        assert item["object"] == "api_key" and item["status"] == "active"
    text = response.content.decode()
    for new in two_tenants.values():
        prefix, _, secret = new.key.rpartition("-")
        assert secret not in text and new.api_key.secret_hash not in text
    assert two_tenants["b"].api_key.prefix not in text


def test_create_returns_secret_once(api_client, api_key):
    response = api_client.post("/v1/keys", {"name": "ci", "scopes": ["inference"]}, format="json",
                               **bearer(api_key.key))
    assert response.status_code == 201, response.content
    created = response.json()
    assert set(created) == PUBLIC_FIELDS | {"key"}
    assert re.fullmatch(r"sk-[a-z0-9]{10}-[A-Za-z0-9]{43}", created["key"])
    assert created["scopes"] == ["inference"] and created["redacted_value"].endswith(created["key"][-4:])
    # the new key works, and is never shown again
    assert api_client.get("/v1/models", **bearer(created["key"])).status_code == 200
    listing = api_client.get("/v1/keys", **bearer(api_key.key))
    assert created["key"] not in listing.content.decode()
    detail = api_client.get(f"/v1/keys/{created['id']}", **bearer(api_key.key)).json()
    assert "key" not in detail and detail["id"] == created["id"]


def test_create_with_expiry(api_client, api_key):
    expires = int((timezone.now() + timedelta(days=1)).timestamp())
    response = api_client.post("/v1/keys", {"name": "tmp", "expires_at": expires}, format="json", **bearer(api_key.key))
    assert response.status_code == 201
    assert response.json()["expires_at"] == expires


@pytest.mark.parametrize(
    "payload, param",
    [
        ({}, "name"), ({"name": ""}, "name"), ({"name": "nul\x00byte"}, "name"), ({"name": "bell\x07"}, "name"),
        ({"name": "x" * 101}, "name"), ({"name": "x", "scopes": ["root"]}, "scopes"),
        ({"name": "x", "scopes": "inference"}, "scopes"), ({"name": "x", "expires_at": 1}, "expires_at"),
        ({"name": "x", "expires_at": "soon"}, "expires_at"), ({"name": "x", "expires_at": 10**30}, "expires_at"),
    ],
)
def test_create_invalid_input_is_400(api_client, api_key, payload, param):
    response = api_client.post("/v1/keys", payload, format="json", **bearer(api_key.key))
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param


@pytest.mark.parametrize("body, content_type", [("[1, 2]", "application/json"), ("{not json", "application/json"),
                                                ("name=x", "application/x-www-form-urlencoded")])
def test_create_bad_bodies_never_500(api_client, api_key, body, content_type):
    response = api_client.generic("POST", "/v1/keys", body, content_type=content_type, **bearer(api_key.key))
    assert response.status_code in (400, 415)
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}


def test_revoke_own_key(api_client, two_tenants):
    target = two_tenants["a2"]
    response = api_client.post(f"/v1/keys/{target.api_key.public_id}/revoke", **bearer(two_tenants["a"].key))
    assert response.status_code == 200
    assert response.json()["status"] == "revoked" and response.json()["revoked_at"]
    assert api_client.get("/v1/models", **bearer(target.key)).status_code == 401
    # idempotent
    again = api_client.post(f"/v1/keys/{target.api_key.public_id}/revoke", **bearer(two_tenants["a"].key))
    assert again.status_code == 200 and again.json()["revoked_at"] == response.json()["revoked_at"]


def test_delete_revokes(api_client, two_tenants):
    target = two_tenants["a2"]
    response = api_client.delete(f"/v1/keys/{target.api_key.public_id}", **bearer(two_tenants["a"].key))
    assert response.status_code == 200 and response.json()["status"] == "revoked"
    assert ApiKey.objects.get(pk=target.api_key.pk).revoked_at is not None


def test_key_can_revoke_itself(api_client, api_key):
    response = api_client.post(f"/v1/keys/{api_key.api_key.public_id}/revoke", **bearer(api_key.key))
    assert response.status_code == 200
    assert api_client.get("/v1/keys", **bearer(api_key.key)).status_code == 401


@pytest.mark.parametrize("method, suffix", [("get", ""), ("delete", ""), ("post", "/revoke")])
def test_other_tenants_keys_are_404(api_client, two_tenants, method, suffix):
    victim = two_tenants["b"].api_key
    response = getattr(api_client, method)(f"/v1/keys/{victim.public_id}{suffix}", **bearer(two_tenants["a"].key))
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "api_key_not_found"
    victim.refresh_from_db()
    assert victim.revoked_at is None
    assert api_client.get("/v1/models", **bearer(two_tenants["b"].key)).status_code == 200


@pytest.mark.parametrize("key_id", ["abc", "0", "-1", "99999999999999999999999", "1_0", "%C2%B2", "%20%31", "key_",
                                    "key_" + "x" * 40])
def test_odd_ids_are_404(api_client, api_key, key_id):
    response = api_client.get(f"/v1/keys/{key_id}", **bearer(api_key.key))
    assert response.status_code == 404
    # an id the route's converter refuses (common.converters: "²", a space) matches no URL at all
    assert response.json()["error"]["code"] in {"api_key_not_found", "unknown_url"}


def test_key_ids_are_public_ids_not_row_numbers(api_client, api_key):
    """The API names keys by a random public id; the row's sequential pk is not accepted either."""
    listed = api_client.get("/v1/keys", **bearer(api_key.key)).json()["data"]
    assert [k["id"] for k in listed] == [api_key.api_key.public_id]
    assert api_key.api_key.public_id.startswith("key_") and len(api_key.api_key.public_id) == 24
    assert api_client.get(f"/v1/keys/{api_key.api_key.pk}", **bearer(api_key.key)).status_code == 404
    assert api_client.get(f"/v1/keys/{api_key.api_key.public_id}", **bearer(api_key.key)).json()["id"] == listed[0]["id"]


def test_keys_manage_scope_required(api_client, api_key_factory, tenant):
    inference_only = api_key_factory(tenant=tenant, scopes=["inference"])
    other = api_key_factory(tenant=tenant)
    for response in (
        api_client.get("/v1/keys", **bearer(inference_only.key)),  # the list names every key of the tenant
        api_client.get(f"/v1/keys/{other.api_key.public_id}", **bearer(inference_only.key)),
        api_client.post("/v1/keys", {"name": "x"}, format="json", **bearer(inference_only.key)),
        api_client.post(f"/v1/keys/{other.api_key.pk}/revoke", **bearer(inference_only.key)),
        api_client.delete(f"/v1/keys/{other.api_key.pk}", **bearer(inference_only.key)),
    ):
        assert response.status_code == 403
        assert response.json()["error"] == {
            "message": response.json()["error"]["message"], "type": "permission_error", "param": None,
            "code": "insufficient_scope",
        }
    assert ApiKey.objects.get(pk=other.api_key.pk).revoked_at is None


def test_scope_escalation_refused(api_client, api_key_factory, tenant):
    manager = api_key_factory(tenant=tenant, scopes=["keys:manage"])
    response = api_client.post("/v1/keys", {"name": "x", "scopes": ["inference"]}, format="json", **bearer(manager.key))
    assert response.status_code == 403 and response.json()["error"]["param"] == "scopes"
    ok = api_client.post("/v1/keys", {"name": "x"}, format="json", **bearer(manager.key))
    assert ok.status_code == 201 and ok.json()["scopes"] == ["keys:manage"]


def test_keys_endpoints_require_a_key(api_client, api_key):
    for response in (api_client.get("/v1/keys"), api_client.post("/v1/keys", {"name": "x"}, format="json"),
                     api_client.post(f"/v1/keys/{api_key.api_key.public_id}/revoke")):
        assert response.status_code == 401
    assert ApiKey.objects.get(pk=api_key.api_key.pk).revoked_at is None
