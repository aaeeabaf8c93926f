"""Every client error of /v1/chat/completions and /v1/completions: status, OpenAI body, param.

The parse-level cases run without a database; the HTTP cases go through the
real ASGI application (Django's handler, middleware, URL routing, the async
views) with real API keys. None of them reaches the engine: every one fails
before a job is queued.
"""

from __future__ import annotations

import json
import time

import pytest
from asgiref.sync import sync_to_async

from common.errors import ApiError
from inference.api.parsing import json_object_parse
from inference.api.schemas import chat_request_parse, completion_request_parse

MSG = [{"role": "user", "content": "Hello"}]
MODEL = "smollm2-135m-instruct"


def chat(**fields):
    return {"model": MODEL, "messages": MSG, **fields}


def comp(**fields):
    return {"model": MODEL, "prompt": "Once upon a time", **fields}


def assert_openai_error(body: dict, *, param, code=None, error_type="invalid_request_error"):
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert error["type"] == error_type
    assert error["param"] == param
    if code is not None:
        assert error["code"] == code


# ---------------------------------------------------------------- parse level
CHAT_BAD = [
    ({"messages": MSG}, "model"),
    ({"model": 5, "messages": MSG}, "model"),
    ({"model": "", "messages": MSG}, "model"),
    ({"model": MODEL}, "messages"),
    (chat(messages="hi"), "messages"),
    (chat(messages=[]), "messages"),
    (chat(messages=["hi"]), "messages[0]"),
    (chat(messages=[{"content": "x"}]), "messages[0].role"),
    (chat(messages=[{"role": 3, "content": "x"}]), "messages[0].role"),
    (chat(messages=[{"role": "user", "content": "a"}, {"role": "wizard", "content": "x"}]), "messages[1].role"),
    (chat(messages=[{"role": "tool", "content": "x", "tool_call_id": "1"}]), "messages[0].role"),  # answers nothing
    (chat(messages=[{"role": "function", "content": "x", "name": "f"}]), "messages[0].role"),
    (chat(messages=[{"role": "user"}]), "messages[0].content"),
    (chat(messages=[{"role": "user", "content": 5}]), "messages[0].content"),
    (chat(messages=[{"role": "user", "content": {"text": "x"}}]), "messages[0].content"),
    (chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]), "messages[0].content[0].type"),
    (chat(messages=[{"role": "user", "content": [{"type": "text", "text": 7}]}]), "messages[0].content[0].text"),
    (chat(messages=[{"role": "user", "content": ["x"]}]), "messages[0].content[0]"),
    (chat(messages=[{"role": "user", "content": "bad \ud800 surrogate"}]), "messages[0].content"),
    (chat(messages=[{"role": "user", "content": "x", "name": 5}]), "messages[0].name"),
    (chat(max_tokens=0), "max_tokens"),
    (chat(max_tokens=-5), "max_tokens"),
    (chat(max_tokens="5"), "max_tokens"),
    (chat(max_tokens=1.5), "max_tokens"),
    (chat(max_tokens=True), "max_tokens"),
    (chat(max_completion_tokens=0), "max_completion_tokens"),
    (chat(max_tokens=5, max_completion_tokens="x"), "max_completion_tokens"),
    (chat(temperature=2.5), "temperature"),
    (chat(temperature=-0.1), "temperature"),
    (chat(temperature="hot"), "temperature"),
    (chat(temperature=float("inf")), "temperature"),
    (chat(temperature=[1]), "temperature"),
    (chat(top_p=0), "top_p"),
    (chat(top_p=1.01), "top_p"),
    (chat(top_k=-2), "top_k"),
    (chat(top_k=1.5), "top_k"),
    (chat(min_p=1.5), "min_p"),
    (chat(presence_penalty=2.01), "presence_penalty"),
    (chat(frequency_penalty=-3), "frequency_penalty"),
    (chat(repetition_penalty=0), "repetition_penalty"),
    (chat(repetition_penalty=-1), "repetition_penalty"),
    (chat(repetition_penalty=5), "repetition_penalty"),
    (chat(logit_bias=[1, 2]), "logit_bias"),
    (chat(logit_bias={"abc": 1}), "logit_bias"),
    (chat(logit_bias={"-3": 1}), "logit_bias"),
    (chat(logit_bias={"5": 101}), "logit_bias"),
    (chat(logit_bias={"5": "x"}), "logit_bias"),
    (chat(logit_bias={str(i): 1 for i in range(2000)}), "logit_bias"),
    (chat(seed="x"), "seed"),
    (chat(seed=2**70), "seed"),
    (chat(seed=1.5), "seed"),
    (chat(stop=5), "stop"),
    (chat(stop=["a", "b", "c", "d", "e"]), "stop"),
    (chat(stop=[""]), "stop[0]"),
    (chat(stop=""), "stop"),
    (chat(stop=["a", 3]), "stop[1]"),
    (chat(stop="x" * 600), "stop"),
    (chat(logprobs="yes"), "logprobs"),
    (chat(logprobs=True, top_logprobs=21), "top_logprobs"),
    (chat(logprobs=True, top_logprobs=-1), "top_logprobs"),
    (chat(top_logprobs=2), "top_logprobs"),
    (chat(logprobs=False, top_logprobs=2), "top_logprobs"),
    (chat(n=2), "n"),
    (chat(n=0), "n"),
    (chat(n="1"), "n"),
    (chat(stream="yes"), "stream"),
    (chat(stream_options={"include_usage": True}), "stream_options"),
    (chat(stream=True, stream_options="usage"), "stream_options"),
    (chat(stream=True, stream_options={"include_usage": "yes"}), "stream_options.include_usage"),
    (chat(service_tier="gold"), "service_tier"),
    (chat(service_tier=1), "service_tier"),
    (chat(user=5), "user"),
    (chat(user="u" * 600), "user"),
    (chat(tools=[{"type": "function", "function": {"name": "f"}}], tool_choice="any"), "tool_choice"),
    (chat(functions=[{"name": "f"}]), "functions"),
    (chat(response_format={"type": "yaml"}), "response_format.type"),
    (chat(response_format="json"), "response_format"),
    (chat(modalities=["text", "audio"]), "modalities"),
    (chat(max_tokens=5, min_tokens=10), "min_tokens"),
    (chat(min_tokens=-1), "min_tokens"),
    (chat(ignore_eos="yes"), "ignore_eos"),
    (chat(stop_token_ids=["a"]), "stop_token_ids"),
]


@pytest.mark.parametrize(("body", "param"), CHAT_BAD, ids=[f"{p}-{i}" for i, (_, p) in enumerate(CHAT_BAD)])
def test_chat_rejects(body, param):
    with pytest.raises(ApiError) as caught:
        chat_request_parse(body=body)
    assert caught.value.status_code == 400
    assert_openai_error(caught.value.body(), param=param)


COMPLETION_BAD = [
    ({"model": MODEL}, "prompt"),
    (comp(prompt=5), "prompt"),
    (comp(prompt=[]), "prompt"),
    (comp(prompt=["a", "b"]), "prompt"),
    (comp(prompt=[1, -1]), "prompt"),
    (comp(prompt=[1, 2**40]), "prompt"),
    (comp(prompt=[[1, "a"]]), "prompt[0]"),
    (comp(prompt=[{"text": "x"}]), "prompt[0]"),
    (comp(prompt=[5, "a"]), "prompt"),
    (comp(prompt="\udfff"), "prompt"),
    (comp(logprobs=True), "logprobs"),
    (comp(logprobs=21), "logprobs"),
    (comp(echo=True), "echo"),
    (comp(best_of=2), "best_of"),
    (comp(suffix="end"), "suffix"),
    (comp(n=3), "n"),
    (comp(max_tokens=0), "max_tokens"),
    (comp(temperature=3), "temperature"),
]


@pytest.mark.parametrize(("body", "param"), COMPLETION_BAD, ids=[f"{p}-{i}" for i, (_, p) in enumerate(COMPLETION_BAD)])
def test_completion_rejects(body, param):
    with pytest.raises(ApiError) as caught:
        completion_request_parse(body=body)
    assert caught.value.status_code == 400
    assert_openai_error(caught.value.body(), param=param)


def test_chat_accepts_openai_fields_and_ignores_unknown_ones():
    request = chat_request_parse(body=chat(
        max_tokens=3, max_completion_tokens=7, temperature=0, top_p=0.5, top_k=40, min_p=0.05,
        presence_penalty=0.5, frequency_penalty=-0.5, repetition_penalty=1.1, logit_bias={"42": -100, "7": 5.5},
        seed=-3, stop="\n", logprobs=True, top_logprobs=3, n=1, user="u-1", stream=True,
        stream_options={"include_usage": True}, service_tier="auto", metadata={"a": "b"}, store=False,
        tools=[], response_format={"type": "text"}, some_future_field={"x": 1},
        messages=[{"role": "developer", "content": "Be brief."}, {"role": "assistant", "content": None},
                  {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]}],
    ))
    assert request.max_tokens == 7 and request.max_tokens_param == "max_completion_tokens"
    assert request.messages == [
        {"role": "system", "content": "Be brief."}, {"role": "assistant", "content": ""}, {"role": "user", "content": "Hi there"},
    ]
    assert request.sampling["logit_bias"] == {42: -100.0, 7: 5.5}
    assert request.sampling["stop"] == ["\n"] and request.sampling["seed"] == -3
    assert request.logprobs == 3 and request.stream and request.include_usage
    assert request.service_tier == "auto" and request.user == "u-1"


def test_chat_logprobs_without_top_means_chosen_token_only():
    assert chat_request_parse(body=chat(logprobs=True)).logprobs == 0
    assert chat_request_parse(body=chat(logprobs=False)).logprobs is None
    assert chat_request_parse(body=chat(max_tokens=5.0)).max_tokens == 5  # integral JSON number


@pytest.mark.parametrize(("prompt", "text", "ids"), [
    ("hi", "hi", None), (["hi"], "hi", None), ([1, 2, 3], None, [1, 2, 3]), ([[4, 5]], None, [4, 5]), ("", "", None),
])
def test_completion_prompt_forms(prompt, text, ids):
    request = completion_request_parse(body=comp(prompt=prompt, logprobs=2))
    assert (request.prompt, request.prompt_token_ids, request.logprobs) == (text, ids, 2)


@pytest.mark.parametrize("raw", [
    b"", b"   ", b"{", b"[1, 2]", b"null", b"42", b'"str"', b"\xff\xfe\x00{", b'{"model": "\xff"}', b"NaN",
    b'{"temperature": NaN}', b'{"temperature": -Infinity}', b"[" * 100_000, b'{"a": 1} trailing',
])
def test_junk_bodies_are_400(raw):
    with pytest.raises(ApiError) as caught:
        json_object_parse(raw=raw)
    assert caught.value.status_code == 400
    assert_openai_error(caught.value.body(), param=None, code="invalid_json")


def test_huge_body_is_413():
    with pytest.raises(ApiError) as caught:
        json_object_parse(raw=b"{" + b" " * 3_000_000 + b"}")
    assert caught.value.status_code == 413


# ---------------------------------------------------------------- over HTTP (ASGI app, real keys)
@pytest.fixture(autouse=True)
def _fresh_model_cache():
    from inference.api.model_access import model_cache_clear

    model_cache_clear()
    yield
    model_cache_clear()


@pytest.fixture
def make_key(api_key_factory, tenant_factory, tier_factory, served_model):
    """Async tests call `await make_key(tier_fields..., tenant_fields=..., key_fields=...)` (ORM off the loop)."""

    def make(tenant_fields=None, key_fields=None, **tier_fields):
        tier_fields.setdefault("allowed_models", ["*"])
        tenant = tenant_factory(tier=tier_factory(**tier_fields), **(tenant_fields or {}))
        return api_key_factory(tenant=tenant, **(key_fields or {})).key

    return sync_to_async(make)


def auth(key: str, **headers) -> dict:
    return {"Authorization": f"Bearer {key}", **headers}


async def post(client, path: str, key: str | None, body, **headers):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = auth(key, **headers) if key else headers
    return await client.post(path, content=content, headers={"Content-Type": "application/json", **headers})


def check(response, status: int, *, param, code=None, error_type="invalid_request_error"):
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    assert len(response.headers["x-request-id"]) == 32
    assert int(response.headers["openai-processing-ms"]) >= 0
    assert response.headers["x-content-type-options"] == "nosniff"
    assert_openai_error(response.json(), param=param, code=code, error_type=error_type)


pytestmark_db = pytest.mark.django_db(transaction=True)


@pytestmark_db
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize("authorization", [None, "", "Bearer", "Bearer sk-nope", "Basic abc", "Bearer " + "x" * 5000])
async def test_bad_keys_are_401(asgi_client, path, authorization):
    headers = {} if authorization is None else {"Authorization": authorization}
    response = await asgi_client.post(path, content=json.dumps(chat()).encode(), headers=headers)
    check(response, 401, param=None, code="invalid_api_key")


@pytestmark_db
async def test_suspended_tenant_and_missing_scope_are_403(asgi_client, make_key):
    suspended = await make_key(tenant_fields={"status": "suspended"})
    check(await post(asgi_client, "/v1/chat/completions", suspended, chat()), 403, param=None, error_type="permission_error")
    usage_only = await make_key(key_fields={"scopes": ["usage:read"]})
    check(await post(asgi_client, "/v1/chat/completions", usage_only, chat()), 403, param=None, error_type="permission_error")


@pytestmark_db
@pytest.mark.parametrize("raw", [b"", b"{not json", b"\xff\xfe\xfa", b"[]", b'{"a": NaN}', b"[" * 50_000])
async def test_junk_over_http_is_400(asgi_client, key, raw):
    check(await post(asgi_client, "/v1/chat/completions", key, raw), 400, param=None, code="invalid_json")


@pytestmark_db
@pytest.mark.parametrize(("body", "param"), [CHAT_BAD[i] for i in (0, 5, 9, 17, 20, 27, 31, 43, 55, 61, 65, 73)])
async def test_chat_field_errors_over_http(asgi_client, key, body, param):
    check(await post(asgi_client, "/v1/chat/completions", key, body), 400, param=param)


@pytestmark_db
@pytest.mark.parametrize(("body", "param"), COMPLETION_BAD[:6])
async def test_completion_field_errors_over_http(asgi_client, key, body, param):
    check(await post(asgi_client, "/v1/completions", key, body), 400, param=param)


@pytestmark_db
async def test_unknown_disabled_and_forbidden_models_are_404(asgi_client, make_key):
    from inference.models import ServedModel

    await ServedModel.objects.acreate(name="off-model", source="gguf:/nowhere.gguf", enabled=False)
    key = await make_key()
    for name in ["no-such-model", "off-model", "/etc/passwd", "../" * 50]:
        check(await post(asgi_client, "/v1/chat/completions", key, chat(model=name)), 404, param="model", code="model_not_found")
    narrow = await make_key(allowed_models=["other"])
    for path, body in [("/v1/chat/completions", chat()), ("/v1/completions", comp())]:
        check(await post(asgi_client, path, narrow, body), 404, param="model", code="model_not_found")


@pytestmark_db
@pytest.mark.parametrize(("fields", "param"), [
    ({"max_tokens": 257}, "max_tokens"),
    ({"max_tokens": 10**30}, "max_tokens"),
    ({"max_tokens": 5, "max_completion_tokens": 300}, "max_completion_tokens"),
])
async def test_tier_output_cap(asgi_client, key, fields, param):
    check(await post(asgi_client, "/v1/chat/completions", key, chat(**fields)), 400, param=param)


@pytestmark_db
async def test_context_length_exceeded(asgi_client, make_key):
    key = await make_key(max_context=64, max_output_tokens=64)
    long_text = "word " * 200
    response = await post(asgi_client, "/v1/chat/completions", key, chat(messages=[{"role": "user", "content": long_text}]))
    check(response, 400, param="messages", code="context_length_exceeded")
    assert "maximum context length is 64 tokens" in response.json()["error"]["message"]
    response = await post(asgi_client, "/v1/completions", key, comp(prompt=long_text, max_tokens=4))
    check(response, 400, param="prompt", code="context_length_exceeded")
    # fits alone, but not with the requested completion
    response = await post(asgi_client, "/v1/completions", key, comp(prompt="word " * 30, max_tokens=60))
    check(response, 400, param="prompt", code="context_length_exceeded")


@pytestmark_db
async def test_vocabulary_checks(asgi_client, key):
    check(await post(asgi_client, "/v1/chat/completions", key, chat(logit_bias={"49152": 5})), 400, param="logit_bias")
    check(await post(asgi_client, "/v1/completions", key, comp(prompt=[1, 2, 49152])), 400, param="prompt")


@pytestmark_db
async def test_no_worker_is_503(asgi_client, key, settings):
    from inference.engine.registry import builtin_gguf_path
    from inference.models import ServedModel

    settings.EMBEDDED_WORKER = False
    settings.MODEL_WAIT_S = 0.3  # the bounded wait for a worker, kept short here
    await ServedModel.objects.acreate(name="ghost-model", source=f"gguf:{builtin_gguf_path()}", enabled=True)
    started = time.monotonic()
    response = await post(asgi_client, "/v1/chat/completions", key, chat(model="ghost-model"))
    check(response, 503, param=None, code="model_unavailable", error_type="server_error")
    assert "ghost-model" in response.json()["error"]["message"] and int(response.headers["retry-after"]) >= 1
    assert 0.3 <= time.monotonic() - started < 5  # it waited for a worker, a bounded time


@pytestmark_db
async def test_method_size_and_headers(asgi_client, key):
    response = await asgi_client.get("/v1/chat/completions", headers=auth(key))
    check(response, 405, param=None, code="method_not_allowed")
    assert response.headers["allow"] == "POST"
    huge = json.dumps(chat(messages=[{"role": "user", "content": "x" * 3_000_000}])).encode()
    check(await post(asgi_client, "/v1/chat/completions", key, huge), 413, param=None, code="request_too_large")
    response = await post(asgi_client, "/v1/chat/completions", key, chat(n=2), **{"X-Client-Request-Id": "my-trace-1"})
    check(response, 400, param="n")
    assert response.headers["x-client-request-id"] == "my-trace-1"
    response = await post(asgi_client, "/v1/chat/completions", key, chat(n=2), **{"X-Client-Request-Id": "x" * 600})
    assert "x-client-request-id" not in response.headers


@pytestmark_db
async def test_host_header_is_checked(asgi_client, key):
    response = await post(asgi_client, "/v1/chat/completions", key, chat(), Host="evil.example")
    check(response, 400, param=None, code="invalid_host")


@pytestmark_db
async def test_api_paths_skip_request_started_but_still_end_with_request_finished(asgi_client, key):
    """The API handler drops Django's request_started (a hop to the sync thread before the view);
    request_finished (which closes stale database connections) still runs once per request."""
    from django.core import signals

    seen: list[str] = []

    def on_started(**_kwargs):
        seen.append("started")

    def on_finished(**_kwargs):
        seen.append("finished")

    signals.request_started.connect(on_started)
    signals.request_finished.connect(on_finished)
    try:
        check(await post(asgi_client, "/v1/chat/completions", key, chat(n=2)), 400, param="n")
        assert seen == ["finished"]
        seen.clear()
        response = await asgi_client.get("/v1/models", headers=auth(key))  # not an API_PATHS route: Django's own handler
        assert response.status_code == 200
        assert seen == ["started", "finished"]
    finally:
        signals.request_started.disconnect(on_started)
        signals.request_finished.disconnect(on_finished)
