"""The completion paths' own ASGI handler (inference/api/asgi.py) applies what Django's middleware would.

Every request here goes to the same view twice, through the API handler (as
platform_site.asgi routes it) and through Django's standard ASGIHandler with
settings.MIDDLEWARE, and the responses are compared: the security headers
(SecurityMiddleware, XFrameOptionsMiddleware), Content-Length
(CommonMiddleware), the SSL redirect, the Host check and the request size
limit. A header or status the stack gives and the API handler does not, or the
other way round, fails the test.
"""

from __future__ import annotations

import json

import httpx
import pytest
from asgiref.sync import sync_to_async
from django.core.exceptions import ImproperlyConfigured
from django.db import connections

pytestmark = pytest.mark.django_db(transaction=True)

MODEL = "smollm2-135m-instruct"
PER_REQUEST = {"x-request-id", "openai-processing-ms",  # differ between any two requests
               # a request refused for its body counts against the key's RPM: the second has one fewer left
               "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests"}


@pytest.fixture
async def both():
    """Builds (API handler client, Django stack client) after the test's settings are in place:
    middleware read their settings when they are built, as at a process's start."""
    from django.core.handlers.asgi import ASGIHandler

    from inference.api.asgi import api_http_router

    clients: list[httpx.AsyncClient] = []

    def build(base_url: str = "http://testserver"):
        async def unused(scope, receive, send):
            raise AssertionError(f"{scope['path']} should have gone to the API handler")

        api_app, django_app = api_http_router(unused), ASGIHandler()
        pair = [httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=base_url)
                for app in (api_app, django_app)]
        clients.extend(pair)
        return pair

    yield build
    for client in clients:
        await client.aclose()


@pytest.fixture
def key(api_key_factory, tenant_factory, tier_factory, served_model):
    from inference.api.model_access import model_cache_clear

    model_cache_clear()
    return api_key_factory(tenant=tenant_factory(tier=tier_factory(allowed_models=["*"]))).key


def _headers(response: httpx.Response) -> dict[str, str]:
    return {name: value for name, value in response.headers.items() if name not in PER_REQUEST}


async def _same(api: httpx.AsyncClient, stack: httpx.AsyncClient, method: str, path: str, **kwargs):
    """Send one request through both handlers; assert the same status, headers and body."""
    via_api = await api.request(method, path, **kwargs)
    via_stack = await stack.request(method, path, **kwargs)
    assert via_api.status_code == via_stack.status_code, (via_api.text, via_stack.text)
    assert _headers(via_api) == _headers(via_stack)
    return via_api, via_stack


def _post(key: str, body, **headers) -> dict:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}", **headers}
    return {"content": content, "headers": headers}


def _chat(**fields) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}], **fields}


@pytest.fixture(autouse=True)
async def _close_connections():
    yield
    await sync_to_async(connections.close_all)()


async def test_the_same_headers_as_the_middleware_stack(both, key):
    api, stack = both()
    via_api, _ = await _same(api, stack, "POST", "/v1/chat/completions", **_post(key, _chat(n=2)))
    assert via_api.status_code == 400
    for name, value in {"x-content-type-options": "nosniff", "referrer-policy": "same-origin",
                        "cross-origin-opener-policy": "same-origin", "x-frame-options": "DENY"}.items():
        assert via_api.headers[name] == value  # (what the stack sets today; compared in full above)
    assert int(via_api.headers["content-length"]) == len(via_api.content)
    via_api, _ = await _same(api, stack, "GET", "/v1/completions", headers={"Authorization": f"Bearer {key}"})
    assert via_api.status_code == 405 and via_api.headers["allow"] == "POST"
    await _same(api, stack, "POST", "/v1/completions", **_post("sk-wrong", {"model": MODEL, "prompt": "x"}))


async def test_hsts_and_the_ssl_redirect_as_configured(both, key, settings):
    settings.SECURE_HSTS_SECONDS = 3600
    settings.SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    settings.SECURE_HSTS_PRELOAD = True
    settings.SECURE_SSL_REDIRECT = True
    settings.SECURE_REFERRER_POLICY = "no-referrer"
    settings.X_FRAME_OPTIONS = "SAMEORIGIN"
    api, stack = both()
    via_api, _ = await _same(api, stack, "POST", "/v1/chat/completions", **_post(key, _chat()))
    assert via_api.status_code == 301 and via_api.headers["location"] == "https://testserver/v1/chat/completions"
    behind_tls = _post(key, _chat(n=2), **{"X-Forwarded-Proto": "https"})  # settings.SECURE_PROXY_SSL_HEADER
    via_api, _ = await _same(api, stack, "POST", "/v1/chat/completions", **behind_tls)
    assert via_api.status_code == 400
    assert via_api.headers["strict-transport-security"] == "max-age=3600; includeSubDomains; preload"
    assert via_api.headers["referrer-policy"] == "no-referrer" and via_api.headers["x-frame-options"] == "SAMEORIGIN"


async def test_a_host_outside_allowed_hosts_is_refused_by_both(both, key):
    api, stack = both("http://evil.example")
    via_api = await api.post("/v1/chat/completions", **_post(key, _chat()))
    via_stack = await stack.post("/v1/chat/completions", **_post(key, _chat()))
    assert via_api.status_code == via_stack.status_code == 400
    assert via_api.json()["error"]["code"] == "invalid_host"  # the API's body is OpenAI's shape, the stack's is not
    assert via_api.headers["x-content-type-options"] == via_stack.headers["x-content-type-options"] == "nosniff"


async def test_the_request_size_limit_of_both(both, key, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 4096
    api, stack = both()
    big = _post(key, _chat(messages=[{"role": "user", "content": "x" * 5000}]))
    via_api, via_stack = await _same(api, stack, "POST", "/v1/chat/completions", **big)
    assert via_api.status_code == 413 and via_api.json() == via_stack.json()
    assert via_api.json()["error"]["code"] == "request_too_large" and "4096" in via_api.json()["error"]["message"]
    small = _post(key, _chat(n=2, messages=[{"role": "user", "content": "x" * 3000}]))
    via_api, _ = await _same(api, stack, "POST", "/v1/chat/completions", **small)
    assert via_api.status_code == 400  # under the limit: parsed, then refused for n


def test_every_middleware_is_applied_or_known_to_have_nothing_to_do(settings):
    from inference.api import asgi

    assert asgi.api_middleware_unknown() == []
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "tests.inference.test_api_asgi.SomeMiddleware"]
    assert asgi.api_middleware_unknown() == ["tests.inference.test_api_asgi.SomeMiddleware"]

    async def fallback(scope, receive, send):
        return None

    assert asgi.api_http_router(fallback) is fallback  # a middleware it cannot apply: Django's stack for all
    with pytest.raises(ImproperlyConfigured, match="SomeMiddleware"):
        asgi.ApiASGIHandler()
