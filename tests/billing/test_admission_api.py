"""Admission through the real ASGI application: headers on every completion (streamed too), 429 and
503 bodies, the WebSocket's error frame, and the `openai` SDK's RateLimitError and its wait.

The completions that are admitted run on the embedded engine with the real model (one token each);
the limits run on the in-process backend with an injected clock, so nothing sleeps.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

import httpx
import openai
import pytest
from asgiref.sync import sync_to_async

from billing.counters import reset_admission_backend
from billing.counters.memory import MemoryAdmission
from tests.billing.admission_helpers import Clock
from tests.inference.api_fixtures import asgi_client  # noqa: F401
from tests.inference.test_api_validation import MODEL, chat, check, make_key, post  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _embedded_engine(settings):
    """The engine in this process, also under `make test-postgres` (REDIS_URL set: its queue is Redis's)."""
    settings.EMBEDDED_WORKER = True


@pytest.fixture(scope="module", autouse=True)
def _pool_closed_after():
    """Stop the engine thread and close the PostgreSQL pool it used, so the test database can be dropped."""
    yield
    from django.db import connection

    from inference.worker.embedded import embedded_worker_stop

    embedded_worker_stop()

    close_pool = getattr(connection, "close_pool", None)
    if close_pool is not None and getattr(connection, "pool", None) is not None:
        close_pool()


@pytest.fixture
def clock():
    clock = Clock(datetime.now(timezone.utc).timestamp())
    reset_admission_backend(MemoryAdmission(clock=clock))
    return clock


def limited(**fields) -> dict:
    base = {"requests_per_minute": 0, "tokens_per_minute": 0, "max_concurrent_requests": 0, "monthly_token_quota": 0}
    return {**base, **fields}


async def test_a_tier_at_3_rpm_answers_the_fourth_request_with_429(asgi_client, make_key, clock):
    key = await make_key(**limited(requests_per_minute=3))
    seen = []
    for stream in (False, True, False):
        response = await post(asgi_client, "/v1/chat/completions", key, chat(max_tokens=1, stream=stream))
        assert response.status_code == 200, response.text
        seen.append((response.headers["x-ratelimit-limit-requests"], response.headers["x-ratelimit-remaining-requests"],
                     response.headers["x-ratelimit-reset-requests"]))
    assert seen == [("3", "2", "20s"), ("3", "1", "40s"), ("3", "0", "1m0s")]
    assert "x-ratelimit-limit-tokens" not in response.headers  # no tokens-per-minute limit on this tier
    response = await post(asgi_client, "/v1/chat/completions", key, chat(max_tokens=1))
    check(response, 429, param=None, code="rate_limit_exceeded", error_type="rate_limit_error")
    message = response.json()["error"]["message"]
    assert "requests per min (RPM): Limit 3, Used 3, Requested 1. Please try again in 20s." in message
    assert response.headers["retry-after"] == "20" and response.headers["retry-after-ms"] == "20000"
    clock.now += 20
    assert (await post(asgi_client, "/v1/chat/completions", key, chat(max_tokens=1))).status_code == 200


async def test_token_headers_and_the_refund_at_settlement(asgi_client, make_key, clock):
    key = await make_key(**limited(tokens_per_minute=10_000))
    # the end-of-text token (id 2) strongly favoured: it stops after a token or so, far below max_tokens
    first = await post(asgi_client, "/v1/completions", key,
                       {"model": MODEL, "prompt": "Hello there", "max_tokens": 100, "logit_bias": {"2": 100}})
    assert first.status_code == 200, first.text
    usage = first.json()["usage"]
    assert usage["completion_tokens"] < 100
    assert int(first.headers["x-ratelimit-remaining-tokens"]) == 10_000 - usage["prompt_tokens"] - 100
    second = await post(asgi_client, "/v1/completions", key, {"model": MODEL, "prompt": "Hi", "max_tokens": 1})
    prompt2 = second.json()["usage"]["prompt_tokens"]
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    used_by_first = usage["prompt_tokens"] - cached + usage["completion_tokens"]  # the rest came back when it ended
    assert int(second.headers["x-ratelimit-remaining-tokens"]) == 10_000 - used_by_first - prompt2 - 1


async def test_counters_unreachable_is_503_and_nothing_runs(asgi_client, make_key):
    from billing.counters.redis_backend import RedisAdmission
    from billing.models import UsageRecord

    reset_admission_backend(RedisAdmission(url="redis://127.0.0.1:1/0"))
    key = await make_key(**limited(requests_per_minute=3))
    response = await post(asgi_client, "/v1/chat/completions", key, chat(max_tokens=1))
    check(response, 503, param=None, code="limits_unavailable", error_type="server_error")
    assert response.headers["retry-after"]
    assert await UsageRecord.objects.acount() == 0  # never queued


async def test_the_openai_sdk_raises_rate_limit_error_and_with_retries_waits_retry_after(asgi_client, make_key, clock,
                                                                                        monkeypatch):
    import openai._base_client as base_client

    key = await make_key(**limited(requests_per_minute=1))
    from platform_site.asgi import application

    http_lib = getattr(base_client, "httpx2", httpx)  # the HTTP library this SDK release is built on
    http = http_lib.AsyncClient(transport=http_lib.ASGITransport(app=application), base_url="http://testserver")
    sdk = openai.AsyncOpenAI(base_url="http://testserver/v1", api_key=key, max_retries=0, http_client=http)
    await sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=1)
    with pytest.raises(openai.RateLimitError) as refused:
        await sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=1)
    assert refused.value.code == "rate_limit_exceeded" and refused.value.status_code == 429
    waits = []

    async def sleep(seconds: float) -> None:  # the SDK's wait, on the limiter's clock
        waits.append(seconds)
        clock.now += seconds

    monkeypatch.setattr(base_client.anyio, "sleep", sleep)
    retrying = sdk.with_options(max_retries=2)
    reply = await retrying.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                                   max_tokens=1)
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert waits == [pytest.approx(60.0, abs=0.01)]  # retry-after-ms, honoured to the millisecond


async def test_the_websocket_answers_a_refusal_with_an_error_frame(make_key, clock):
    from asgiref.testing import ApplicationCommunicator

    from platform_site.asgi import application

    key = await make_key(**limited(max_concurrent_requests=1), tenant_fields={"monthly_spend_limit_micros": 1})
    await sync_to_async(_price)()
    socket = ApplicationCommunicator(application, {
        "type": "websocket", "path": "/v1/realtime", "query_string": b"", "subprotocols": [],
        "headers": [(b"host", b"testserver"), (b"authorization", f"Bearer {key}".encode())],
    })
    await socket.send_input({"type": "websocket.connect"})
    assert (await socket.receive_output(10))["type"] == "websocket.accept"

    async def frame() -> dict:
        return json.loads((await socket.receive_output(30))["text"])

    assert (await frame())["type"] == "authenticated"
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 10}
    await socket.send_input({"type": "websocket.receive",
                             "text": json.dumps({"type": "request", "id": "a", "endpoint": "chat.completions", "body": body})})
    error = await frame()
    assert error["type"] == "error" and error["id"] == "a"
    assert error["error"]["code"] == "insufficient_quota" and "monthly budget" in error["error"]["message"]
    await socket.send_input({"type": "websocket.disconnect", "code": 1000})
    await socket.wait(5)


def _price():
    from billing.models import Price

    Price.objects.create(model=MODEL, input_per_million="1", cached_input_per_million="1", output_per_million="1",
                         effective_from=datetime(2020, 1, 1, tzinfo=timezone.utc))
