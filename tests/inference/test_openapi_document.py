"""/v1/openapi.json describes every /v1 endpoint, and every path under /v1 answers errors in the OpenAI shape."""

from __future__ import annotations

import json
import re

import pytest
from django.urls import URLPattern, URLResolver, get_resolver

from tests.conftest import bearer

pytestmark = pytest.mark.django_db
ERROR_FIELDS = {"message", "type", "param", "code"}


def _routes(patterns, prefix: str = ""):
    for entry in patterns:
        if isinstance(entry, URLResolver):
            yield from _routes(entry.url_patterns, prefix + str(entry.pattern))
        elif isinstance(entry, URLPattern):
            yield prefix + str(entry.pattern)


def v1_routes() -> set[str]:
    """The /v1 URL patterns of the URL configuration, in OpenAPI's path syntax."""
    routes = {route for route in _routes(get_resolver().url_patterns) if route.startswith("v1/")}
    return {"/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", route) for route in routes}


def test_document_is_openapi_3_1_and_covers_every_v1_route(client):
    response = client.get("/v1/openapi.json")
    assert response.status_code == 200
    document = response.json()
    assert document["openapi"].startswith("3.1")
    assert v1_routes() - set(document["paths"]) == set()
    for path, item in document["paths"].items():
        for method, operation in item.items():
            assert operation["responses"]["default"]["content"]["application/json"]["schema"] == {
                "$ref": "#/components/schemas/Error"}, (method, path)
    assert document["paths"]["/v1/chat/completions"]["post"]["security"] == [{"ApiKey": []}]
    assert "/v1/realtime" not in document["paths"]  # a WebSocket, not an HTTP operation


@pytest.mark.parametrize("debug", [False, True])
@pytest.mark.parametrize("path", ["/v1/nope", "/v1/keys/x/y/z", "/v1", "/v1/models/"])
def test_unknown_v1_paths_answer_openai_404(client, settings, debug, path):
    settings.DEBUG = debug
    response = client.get(path, HTTP_ACCEPT="text/html")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("application/json")
    assert set(response.json()["error"]) == ERROR_FIELDS and response.json()["error"]["code"] == "unknown_url"


@pytest.mark.parametrize("method, path", [("put", "/v1/models"), ("delete", "/v1/invoices"), ("patch", "/v1/keys"),
                                          ("get", "/v1/chat/completions"), ("put", "/v1/completions"),
                                          ("post", "/v1/openapi.json")])
def test_wrong_methods_answer_openai_405(client, api_key, method, path):
    response = getattr(client, method)(path, **bearer(api_key.key))
    assert response.status_code == 405
    assert set(response.json()["error"]) == ERROR_FIELDS and response.json()["error"]["code"] == "method_not_allowed"
    assert response["Allow"]


def test_a_non_json_error_under_v1_is_reshaped(rf):
    """Any HTML error page Django makes for a /v1 path (a require_http_methods 405 here) leaves as JSON."""
    from django.http import HttpResponseNotAllowed

    from common.middleware import ApiErrorShapeMiddleware

    middleware = ApiErrorShapeMiddleware(lambda request: HttpResponseNotAllowed(["GET"]))
    response = middleware(rf.post("/v1/anything"))
    assert response.status_code == 405 and response["Allow"] == "GET"
    assert json.loads(response.content)["error"]["code"] == "method_not_allowed"
    html = ApiErrorShapeMiddleware(lambda request: HttpResponseNotAllowed(["GET"]))(rf.post("/billing/x"))
    assert html.status_code == 405 and not html["Content-Type"].startswith("application/json")
