"""DRF authentication over HTTP: every failure path has its status and OpenAI body."""

from datetime import timedelta

import pytest
from django.utils import timezone

from tenants.models import ApiKey, Tenant
from tests.conftest import bearer

URLS = ["/v1/models", "/v1/keys"]


def assert_error(response, status, code, error_type="invalid_request_error"):
    assert response.status_code == status, response.content
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == code
    assert body["error"]["type"] == error_type
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    if status == 401:
        assert response["WWW-Authenticate"].startswith("Bearer")
    return body


@pytest.mark.parametrize("url", URLS)
def test_success(api_client, api_key, served_model, url):
    response = api_client.get(url, **bearer(api_key.key))
    assert response.status_code == 200
    assert response.json()["object"] == "list"


@pytest.mark.parametrize("url", URLS)
def test_missing_key(api_client, db, url):
    body = assert_error(api_client.get(url), 401, "invalid_api_key")
    assert "didn't provide an API key" in body["error"]["message"]


@pytest.mark.parametrize(
    "header",
    ["Bearer", "Bearer ", "Token abc", "Basic dXNlcjpwYXNz", "Bearer a b c", "bearer", "sk-abc",
     "Bearer " + "A" * 100_000, "Bearer sk-\x00\x00", "Bearer sk-aaaaaaaaaa-" + "\u00e9" * 43,
     "Bearer  \t sk-", "\x00", "Bearer sk-aaaaaaaaaa-" + "a" * 44, "Bearer 日本語"],
)
def test_malformed_header(api_client, db, header):
    assert_error(api_client.get("/v1/models", HTTP_AUTHORIZATION=header), 401, "invalid_api_key")


def test_non_latin1_bytes_in_header(db):
    """Raw bytes as a server would pass them (latin-1 decoded): still a 401, never a 500."""
    from django.test import Client

    raw = bytes(range(128, 256)).decode("latin-1")
    response = Client().get("/v1/models", HTTP_AUTHORIZATION="Bearer " + raw)
    assert_error(response, 401, "invalid_api_key")


def test_unknown_key(api_client, db):
    key = "sk-abcdefghij-" + "A" * 43
    body = assert_error(api_client.get("/v1/models", **bearer(key)), 401, "invalid_api_key")
    assert "Incorrect API key" in body["error"]["message"]
    assert key not in body["error"]["message"]


def test_wrong_secret_for_known_prefix(api_client, api_key):
    key = api_key.key[:-3] + ("xyz" if not api_key.key.endswith("xyz") else "abc")
    assert_error(api_client.get("/v1/models", **bearer(key)), 401, "invalid_api_key")


def test_revoked_key(api_client, api_key):
    assert api_client.get("/v1/models", **bearer(api_key.key)).status_code == 200
    ApiKey.objects.filter(pk=api_key.api_key.pk).update(revoked_at=timezone.now())
    body = assert_error(api_client.get("/v1/models", **bearer(api_key.key)), 401, "invalid_api_key")
    assert "revoked" in body["error"]["message"]


def test_expired_key(api_client, api_key):
    ApiKey.objects.filter(pk=api_key.api_key.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    body = assert_error(api_client.get("/v1/models", **bearer(api_key.key)), 401, "invalid_api_key")
    assert "expired" in body["error"]["message"]


def test_suspended_tenant(api_client, api_key, tenant):
    Tenant.objects.filter(pk=tenant.pk).update(status=Tenant.Status.SUSPENDED)
    response = api_client.get("/v1/models", **bearer(api_key.key))
    assert_error(response, 403, "tenant_suspended", error_type="permission_error")
    Tenant.objects.filter(pk=tenant.pk).update(status=Tenant.Status.ACTIVE)
    assert api_client.get("/v1/models", **bearer(api_key.key)).status_code == 200


def test_request_carries_tenant_tier_and_key(rf, api_key, tenant):
    from rest_framework.request import Request

    from tenants.auth import ApiKeyAuthentication, ApiPrincipal, AuthContext

    request = Request(rf.get("/v1/models", **bearer(api_key.key)), authenticators=[ApiKeyAuthentication()])
    assert isinstance(request.user, ApiPrincipal) and request.user.is_authenticated
    assert isinstance(request.auth, AuthContext)
    assert (request.auth.tenant, request.auth.tier, request.auth.api_key) == (tenant, tenant.tier, api_key.api_key)


async def test_async_client_through_asgi_handler(db):
    """The ASGI request path (what uvicorn runs) gives the same 401 body."""
    from django.test import AsyncClient

    response = await AsyncClient().get("/v1/models", headers={"Authorization": "Bearer nope"})
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"
