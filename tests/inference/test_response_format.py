"""`response_format` on the web side: parsing (every error with OpenAI's param), the schema check and its cache,
the wire form to the worker, a worker-side grammar failure as a 400, and a bad schema refused before admission.

The end to end half (the openai SDK's `parse` against the real model) is tests/e2e/test_structured_outputs_e2e.py.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from types import SimpleNamespace

import pytest

from common.errors import InvalidRequest
from inference.api import response_format as rf_module
from inference.api.job_run import done_error
from inference.api.schemas import CHAT, chat_request_parse, completion_request_parse
from inference.api.services import sampling_build
from inference.api.response_format import aresponse_format_check, response_format_cache_clear
from inference.engine.sampling_params import EngineValidationError, SamplingParams
from inference.engine.structured_spec import MAX_SCHEMA_DEPTH, StructuredOutput
from inference.protocol import Done, Usage
from inference.queue.job import Job

# A hang guard, not a speed check (those are benchmarks/grammar_compile.py's): a bounded compile takes
# milliseconds to about a second on a quiet machine; a shared CI machine may be many times slower.
HANG_S = 30.0

MODEL = "smollm2-135m-instruct"
MSG = [{"role": "user", "content": "Hello"}]
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
          "required": ["name", "age"], "additionalProperties": False}


def chat(response_format):
    return {"model": MODEL, "messages": MSG, "response_format": response_format}


def json_schema(**fields):
    return {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, **fields}}


@pytest.fixture(autouse=True)
def _fresh_cache():
    response_format_cache_clear()
    yield
    response_format_cache_clear()


# ---------------------------------------------------------------- parsing
@pytest.mark.parametrize("response_format", [None, {"type": "text"}, {"type": "text", "json_schema": 5}])
def test_text_and_absent_are_no_constraint(response_format):
    request = chat_request_parse(body=chat(response_format))
    assert request.response_format is None and "structured_output" not in request.sampling


def test_json_object_and_json_schema():
    request = chat_request_parse(body=chat({"type": "json_object"}))
    assert request.response_format == StructuredOutput("json_object")
    request = chat_request_parse(body=chat(json_schema(description="A person.", strict=True)))
    assert request.response_format == StructuredOutput("json_schema", PERSON, True)
    assert request.sampling["structured_output"] is request.response_format
    assert chat_request_parse(body=chat(json_schema())).response_format.strict is False  # OpenAI's default
    assert chat_request_parse(body=chat(json_schema(strict=None))).response_format.strict is False


def test_completions_take_it_as_an_extension():
    request = completion_request_parse(body={"model": MODEL, "prompt": "x", "response_format": json_schema()})
    assert request.response_format == StructuredOutput("json_schema", PERSON, False)


BAD = [
    ("json", "response_format", "invalid_type"),
    (["json_object"], "response_format", "invalid_type"),
    ({}, "response_format.type", "missing_required_parameter"),
    ({"type": "yaml"}, "response_format.type", "invalid_value"),
    ({"type": 5}, "response_format.type", "invalid_value"),
    ({"type": "json_schema"}, "response_format.json_schema", "missing_required_parameter"),
    ({"type": "json_schema", "json_schema": "x"}, "response_format.json_schema", "invalid_type"),
    ({"type": "json_schema", "json_schema": {"schema": PERSON}}, "response_format.json_schema.name",
     "missing_required_parameter"),
    (json_schema(name=5), "response_format.json_schema.name", "invalid_type"),
    (json_schema(name=""), "response_format.json_schema.name", "invalid_value"),
    (json_schema(name="a b"), "response_format.json_schema.name", "invalid_value"),
    (json_schema(name="x" * 65), "response_format.json_schema.name", "invalid_value"),
    (json_schema(name="caf\u00e9"), "response_format.json_schema.name", "invalid_value"),
    (json_schema(description=3), "response_format.json_schema.description", "invalid_type"),
    ({"type": "json_schema", "json_schema": {"name": "x"}}, "response_format.json_schema.schema",
     "missing_required_parameter"),
    (json_schema(schema=[1]), "response_format.json_schema.schema", "invalid_type"),
    (json_schema(schema=True), "response_format.json_schema.schema", "invalid_type"),
    (json_schema(strict="yes"), "response_format.json_schema.strict", "invalid_type"),
]


@pytest.mark.parametrize(("response_format", "param", "code"), BAD, ids=[f"{p}-{i}" for i, (_, p, _) in enumerate(BAD)])
@pytest.mark.parametrize("parse", [chat_request_parse, completion_request_parse], ids=["chat", "completions"])
def test_bad_shapes_name_their_param(parse, response_format, param, code):
    body = chat(response_format) if parse is chat_request_parse else {
        "model": MODEL, "prompt": "x", "response_format": response_format}
    with pytest.raises(InvalidRequest) as caught:
        parse(body=body)
    error = caught.value.body()["error"]
    assert (error["param"], error["code"], error["type"]) == (param, code, "invalid_request_error"), error


def test_legacy_functions_are_still_refused():
    for name, value in (("functions", [{"name": "f"}]), ("function_call", {"name": "f"})):
        with pytest.raises(InvalidRequest) as caught:
            chat_request_parse(body={**chat({"type": "json_object"}), name: value})
        assert caught.value.body()["error"]["param"] == name


# ---------------------------------------------------------------- the wire form (web -> queue -> worker)
def test_sampling_carries_the_spec_to_the_worker_through_the_job_json():
    request = chat_request_parse(body=chat(json_schema(strict=True)))
    sampling = sampling_build(request=request, max_tokens=16, vocab_size=49152)
    assert sampling["structured_output"] == {"kind": "json_schema", "schema": PERSON, "strict": True}
    job = Job("r1", 1, None, "pro", 1, MODEL, [1, 2], sampling, "reply")
    params = SamplingParams.from_dict(dict(Job.from_json(job.to_json()).sampling))
    assert params.structured_output == StructuredOutput("json_schema", PERSON, True)
    # no response_format: no key at all (a worker from before structured outputs still reads the job)
    plain = sampling_build(request=chat_request_parse(body=chat(None)), max_tokens=16, vocab_size=49152)
    assert "structured_output" not in plain


def test_size_and_depth_bounds_are_400s_before_any_compile(monkeypatch):
    monkeypatch.setattr(rf_module, "check", lambda spec: pytest.fail("compiled"))
    deep: dict = {"type": "object"}
    node = deep
    for _ in range(MAX_SCHEMA_DEPTH):
        node["properties"] = {"a": {"type": "object"}}
        node = node["properties"]["a"]
    huge = {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "x" * 100} for i in range(1200)}}
    for schema in (deep, huge):
        request = chat_request_parse(body=chat(json_schema(schema=schema)))
        with pytest.raises(InvalidRequest) as caught:
            sampling_build(request=request, max_tokens=8, vocab_size=49152)
        assert caught.value.body()["error"]["param"] == "response_format"


# ---------------------------------------------------------------- the schema check and its cache
async def test_a_valid_schema_passes_and_a_bad_one_names_the_problem():
    await aresponse_format_check(spec=StructuredOutput("json_schema", PERSON, True))
    await aresponse_format_check(spec=StructuredOutput("json_object"))
    cases = [
        ({"type": "array", "uniqueItems": True}, True, "uniqueItems"),
        ({"type": "object", "not": {"type": "object"}}, True, "not"),
        ({"type": "strnig"}, False, "Invalid JSON schema"),
        ({"type": "string", "pattern": "[a-"}, False, "regex"),
        ({"type": "integer", "minimum": 5, "maximum": 2}, False, "minimum"),
    ]
    for schema, strict, named in cases:
        with pytest.raises(InvalidRequest) as caught:
            await aresponse_format_check(spec=StructuredOutput("json_schema", schema, strict))
        error = caught.value.body()["error"]
        assert error["param"] == "response_format" and named in error["message"], (schema, error)
    # llguidance 1.9.1 panics (pyo3's PanicException, a BaseException) quoting this invalid value: still a 400
    panics = {"minimum": {"k": "a" * 75 + "\u00e9" * 10}}
    with pytest.raises(InvalidRequest) as caught:
        await aresponse_format_check(spec=StructuredOutput("json_schema", panics, False))
    assert caught.value.body()["error"]["param"] == "response_format"
    # strict false: keywords it cannot enforce are ignored
    await aresponse_format_check(spec=StructuredOutput("json_schema", {"type": "array", "uniqueItems": True}, False))


def _counting_check(monkeypatch, *, fail_on=None, delay=0.0):
    calls = []
    original = rf_module.check

    def counted(spec):
        calls.append(spec.key)
        time.sleep(delay)
        if fail_on is not None and fail_on in spec.key:
            raise EngineValidationError("bad schema", "response_format")
        return original(spec)

    monkeypatch.setattr(rf_module, "check", counted)
    return calls


async def test_results_are_cached_by_the_canonical_key_failures_too(monkeypatch):
    calls = _counting_check(monkeypatch, fail_on="uniqueItems")
    for _ in range(3):
        await aresponse_format_check(spec=StructuredOutput("json_schema", dict(PERSON), True))  # equal, new objects
    bad = {"type": "array", "uniqueItems": True}
    for _ in range(3):
        with pytest.raises(InvalidRequest):
            await aresponse_format_check(spec=StructuredOutput("json_schema", dict(bad), True))
    assert len(calls) == 2
    # strict is part of the key; so is the key order of "properties" (the output's order)
    await aresponse_format_check(spec=StructuredOutput("json_schema", dict(PERSON), False))
    reordered = {**PERSON, "properties": {"age": PERSON["properties"]["age"], "name": PERSON["properties"]["name"]}}
    await aresponse_format_check(spec=StructuredOutput("json_schema", reordered, False))
    assert len(calls) == 4


async def test_concurrent_requests_share_one_compile_off_the_event_loop(monkeypatch):
    calls = _counting_check(monkeypatch, delay=0.3)
    loop_thread = threading.get_ident()
    threads = []
    original = rf_module.check
    monkeypatch.setattr(rf_module, "check", lambda spec: (threads.append(threading.get_ident()), original(spec)))
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.02)
            ticks += 1

    tick = asyncio.create_task(ticker())
    await asyncio.gather(*(aresponse_format_check(spec=StructuredOutput("json_schema", dict(PERSON), True))
                           for _ in range(5)))
    tick.cancel()
    assert len(calls) == 1 and threads and loop_thread not in threads
    assert ticks >= 5  # the loop kept running while the schema compiled


async def test_the_cache_is_bounded_lru(monkeypatch):
    monkeypatch.setattr(rf_module, "CACHE_SIZE", 2)
    calls = _counting_check(monkeypatch)
    specs = [StructuredOutput("json_schema", {"type": "integer", "minimum": i}, False) for i in range(3)]
    for spec in (specs[0], specs[1], specs[0], specs[2]):  # 0 used again: 1 is the least recent, evicted
        await aresponse_format_check(spec=spec)
    assert len(rf_module._cache) == 2 and len(calls) == 3
    await aresponse_format_check(spec=specs[0])
    assert len(calls) == 3
    await aresponse_format_check(spec=specs[1])
    assert len(calls) == 4


async def test_an_unexpected_exception_is_a_400_never_a_500(monkeypatch):
    def boom(spec):
        raise RuntimeError("panic in the compiler")

    monkeypatch.setattr(rf_module, "check", boom)
    with pytest.raises(InvalidRequest) as caught:
        await aresponse_format_check(spec=StructuredOutput("json_schema", {"type": "integer"}, False))
    assert caught.value.status_code == 400 and caught.value.body()["error"]["param"] == "response_format"


# ---------------------------------------------------------------- a grammar that fails on the worker
def test_a_worker_side_grammar_failure_is_a_400_for_response_format():
    from inference.worker.ending_thread import _error_param

    job = SimpleNamespace(sampling={"structured_output": {"kind": "json_object", "schema": None, "strict": False}})
    failed = SimpleNamespace(finish_reason="error", error="response_format's grammar did not compile within 10 s")
    assert _error_param(job, failed) == "response_format"
    assert _error_param(SimpleNamespace(sampling={}), failed) is None  # no response_format: the engine's own fault
    assert _error_param(job, SimpleNamespace(finish_reason="error", error="CUDA out of memory")) is None
    assert _error_param(job, SimpleNamespace(finish_reason="stop", error=None)) is None

    done = Done(request_id="r", finish_reason="error", usage=Usage(3, 0, 0), error=failed.error,
                error_param="response_format")
    error = done_error(done, endpoint=CHAT)
    assert error.status_code == 400 and error.body()["error"]["param"] == "response_format"
    assert "did not compile" in error.body()["error"]["message"]
    unexplained = done_error(Done(request_id="r", finish_reason="error", usage=Usage(3, 0, 0), error="boom"),
                             endpoint=CHAT)
    assert unexplained.status_code == 500  # the engine's own failure, as before


# ---------------------------------------------------------------- over HTTP: refused before admission
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_a_bad_schema_is_a_400_before_anything_is_reserved(asgi_client, key, monkeypatch, path):
    import billing.services.admission_reserve as admission

    async def never(**kwargs):
        raise AssertionError("a refused schema reached admission")

    monkeypatch.setattr(admission, "aadmission_reserve", never)
    body = {"model": MODEL, "max_tokens": 8, "response_format": {"type": "json_schema", "json_schema": {
        "name": "tags", "strict": True, "schema": {"type": "array", "uniqueItems": True}}}}
    body.update({"messages": MSG} if "chat" in path else {"prompt": "x"})
    response = await asgi_client.post(path, content=json.dumps(body).encode(), headers={
        "Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "response_format" and "uniqueItems" in error["message"]
    assert error["type"] == "invalid_request_error"
    assert "x-ratelimit-remaining-requests" in response.headers  # counted as any other 400 for its body, no more


# ---------------------------------------------------------------- hostile schemas: a 400 or a pass, never a 500
_KEYWORDS = ["type", "properties", "required", "items", "enum", "const", "anyOf", "oneOf", "allOf", "not", "$ref",
             "$defs", "pattern", "format", "minimum", "maximum", "minLength", "maxLength", "minItems", "maxItems",
             "additionalProperties", "uniqueItems", "if", "then", "multipleOf", "prefixItems", "x-guidance"]


def _schemas():
    from hypothesis import strategies as st

    scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False),
                        st.sampled_from(["string", "integer", "number", "object", "array", "null", "boolean",
                                         "#/$defs/a", "#", "^(a+)+$", "[", "date-time", "email"]),
                        st.text(max_size=8))
    return st.recursive(
        st.dictionaries(st.sampled_from(_KEYWORDS), scalars, max_size=4),
        lambda children: st.one_of(
            st.dictionaries(st.sampled_from(_KEYWORDS), st.one_of(children, st.lists(children, max_size=3)),
                            max_size=4),
            st.dictionaries(st.text(max_size=4), children, max_size=3)),
        max_leaves=25)


def test_hostile_schemas_are_400s_or_pass_and_bounded():
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    @given(schema=_schemas(), strict=st.booleans())
    @settings(max_examples=400, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    def run(schema, strict):
        started = time.perf_counter()
        try:
            request = chat_request_parse(body=chat(json_schema(schema=schema, strict=strict)))
            sampling_build(request=request, max_tokens=8, vocab_size=49152)
            asyncio.run(aresponse_format_check(spec=request.response_format))
        except InvalidRequest as exc:
            assert exc.status_code == 400 and exc.body()["error"]["param"].startswith("response_format")
        assert time.perf_counter() - started < HANG_S

    run()
