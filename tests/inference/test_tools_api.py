"""Tool calling through the API (issue 38): `tools` / `tool_choice` / `parallel_tool_calls` and the messages
that carry calls back, parsed into the request; the prompt; the forcing grammar on the wire; a bad forced
schema a 400 before admission; and the reply shapes (`message.tool_calls`, `delta.tool_calls`, "tool_calls").

The pure core is tests/inference/test_tool_calls.py; the real model through the real server, with the openai
SDK (and LangChain where installed), is tests/e2e/test_tools_e2e.py.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from channels.layers import InMemoryChannelLayer

from common.errors import InvalidRequest
from inference.api.job_run import JobRun, job_chunks
from inference.api.replies import reply_channel_get
from inference.api.response_format import response_format_cache_clear
from inference.api.responses import ResponseBuilder, response_builder
from inference.api.schemas import CHAT, chat_request_parse
from inference.api.services import prompt_tokenize, sampling_build
from inference.api.tool_parser import ToolCallParser
from inference.api.tool_prompt import tools_section
from inference.engine.structured_spec import StructuredOutput
from inference.protocol import Batch, Delta, Done, Usage

MODEL = "smollm2-135m-instruct"
MSG = [{"role": "user", "content": "Weather in Paris?"}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
NOW = {"type": "function", "function": {"name": "now"}}
USAGE = Usage(prompt_tokens=7, cached_tokens=0, completion_tokens=9)
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"},
]


def chat(**fields):
    return {"model": MODEL, "messages": MSG, **fields}


@pytest.fixture(autouse=True)
def _fresh_cache():
    response_format_cache_clear()
    yield
    response_format_cache_clear()


# ---------------------------------------------------------------- parsing into the request
def test_tools_are_parsed_and_a_forced_choice_carries_its_grammar():
    request = chat_request_parse(body=chat(tools=[WEATHER, NOW]))
    assert request.tools.names == ["get_weather", "now"] and request.tools.choice == "auto"
    assert request.tool_prompt and request.parses_tool_calls
    assert "structured_output" not in request.sampling  # auto: the model answers or calls, unconstrained
    for choice in ("required", {"type": "function", "function": {"name": "now"}}):
        request = chat_request_parse(body=chat(tools=[WEATHER, NOW], tool_choice=choice, parallel_tool_calls=False))
        forced = request.sampling["structured_output"]
        assert forced.kind == "tool_calls" and forced.schema["max_calls"] == 1
        names = [f["name"] for f in forced.schema["functions"]]
        assert names == (["get_weather", "now"] if choice == "required" else ["now"])
    none = chat_request_parse(body=chat(tools=[WEATHER], tool_choice="none"))
    assert none.tool_prompt and not none.parses_tool_calls and "structured_output" not in none.sampling
    plain = chat_request_parse(body=chat())
    assert plain.tools is None and not plain.tool_prompt and not plain.parses_tool_calls


def test_a_forced_call_wins_over_a_response_format_and_auto_keeps_it():
    response_format = {"type": "json_object"}
    forced = chat_request_parse(body=chat(tools=[WEATHER], tool_choice="required", response_format=response_format))
    assert forced.response_format == StructuredOutput("json_object")  # still validated
    assert forced.sampling["structured_output"].kind == "tool_calls"
    auto = chat_request_parse(body=chat(tools=[WEATHER], response_format=response_format))
    assert auto.sampling["structured_output"] == StructuredOutput("json_object")


def test_the_forced_grammar_reaches_the_worker_in_the_sampling():
    request = chat_request_parse(body=chat(tools=[WEATHER], tool_choice="required"))
    sampling = sampling_build(request=request, max_tokens=32, vocab_size=49152)
    assert sampling["structured_output"]["kind"] == "tool_calls"


def test_history_with_calls_and_results_is_accepted():
    request = chat_request_parse(body={"model": MODEL, "messages": HISTORY})
    assert request.tools is None and request.tool_history and request.tool_prompt
    assert request.messages[1]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert request.messages[2] == {"role": "tool", "tool_call_id": "call_1", "name": "get_weather",
                                   "content": "Sunny, 21 C"}
    parts = [{"type": "text", "text": "Sunny"}, {"type": "text", "text": ", 21 C"}]
    request = chat_request_parse(body={"model": MODEL, "messages": [*HISTORY[:2], {**HISTORY[2], "content": parts}]})
    assert request.messages[2]["content"] == "Sunny, 21 C"


BAD = [
    (chat(tools={"type": "function"}), "tools", "invalid_type"),
    (chat(tools=[{"type": "function", "function": {"name": "a b"}}]), "tools[0].function.name", "invalid_value"),
    (chat(tools=[WEATHER, WEATHER]), "tools[1].function.name", "invalid_value"),
    (chat(tools=[WEATHER], tool_choice="any"), "tool_choice", "invalid_value"),
    (chat(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}),
     "tool_choice.function.name", "invalid_value"),
    (chat(tool_choice="auto"), "tool_choice", "invalid_value"),
    (chat(tools=[WEATHER], parallel_tool_calls="yes"), "parallel_tool_calls", "invalid_type"),
    (chat(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]),
     "tools[0].function.parameters", "invalid_function_parameters"),
    (chat(functions=[{"name": "f"}]), "functions", "unsupported_parameter"),
    (chat(function_call={"name": "f"}), "function_call", "unsupported_parameter"),
    (chat(messages=[{"role": "function", "name": "f", "content": "x"}]), "messages[0].role", "unsupported_value"),
    (chat(messages=[{"role": "tool", "tool_call_id": "x", "content": "x"}]), "messages[0].role", "invalid_value"),
    (chat(messages=HISTORY[:2]), "messages[1].role", "invalid_value"),  # a call left unanswered
    (chat(messages=[*HISTORY[:2], {**HISTORY[2], "tool_call_id": "call_9"}]), "messages[2].tool_call_id",
     "invalid_value"),
    (chat(messages=[*HISTORY[:2], {"role": "tool", "tool_call_id": "call_1"}]), "messages[2].content",
     "missing_required_parameter"),
    (chat(messages=[{"role": "assistant", "content": None, "tool_calls": [{"id": "c", "function": {"name": "f"}}]},
                    {"role": "tool", "tool_call_id": "c", "content": "x"}]),
     "messages[0].tool_calls[0].function.arguments", "missing_required_parameter"),
]


@pytest.mark.parametrize(("body", "param", "code"), BAD)
def test_bad_bodies_name_their_param(body, param, code):
    with pytest.raises(InvalidRequest) as caught:
        chat_request_parse(body=body)
    error = caught.value.body()["error"]
    assert (error["param"], error["code"], error["type"]) == (param, code, "invalid_request_error"), error


# ---------------------------------------------------------------- the prompt
@pytest.fixture(scope="module")
def tokenizer():
    from inference.engine.tokenizer import load_tokenizer

    return load_tokenizer(MODEL)


def _prompt(tokenizer, body) -> str:
    request = chat_request_parse(body=body)
    ids = prompt_tokenize(request=request, tokenizer=tokenizer, chat_template=tokenizer.chat_template)
    return tokenizer.decode(ids)


def test_the_prompt_lists_the_tools_unless_the_choice_is_none(tokenizer):
    assert tools_section([WEATHER]) in _prompt(tokenizer, chat(tools=[WEATHER]))
    assert tools_section([WEATHER]) in _prompt(tokenizer, chat(tools=[WEATHER], tool_choice="required"))
    assert "<tools>" not in _prompt(tokenizer, chat(tools=[WEATHER], tool_choice="none"))
    history = _prompt(tokenizer, {"model": MODEL, "messages": HISTORY})  # no tools: the history still rendered
    assert "<tools>" not in history and '{"name": "get_weather", "arguments": {"city": "Paris"}}' in history
    assert "<tool_response>\nSunny, 21 C\n</tool_response>" in history
    assert _prompt(tokenizer, chat()) == tokenizer.decode(
        prompt_tokenize(request=chat_request_parse(body=chat()), tokenizer=tokenizer,
                        chat_template=tokenizer.chat_template))  # no tools: the plain template, as before


# ---------------------------------------------------------------- reply shapes
@pytest.fixture(autouse=True)
def no_queue(monkeypatch):
    from inference.api import job_run

    monkeypatch.setattr(job_run, "job_cancel", lambda *, request_id: None)


def ids():
    counter = iter(range(100))
    return lambda: f"call_{next(counter)}"


def builder(*, names=("get_weather", "now"), max_calls=None, **fields) -> ResponseBuilder:
    parser = ToolCallParser(names, max_calls=max_calls, id_factory=ids()) if names else None
    return ResponseBuilder(endpoint=CHAT, request_id="r", created=1, model="m", service_tier="default",
                           tool_parser=parser, **fields)


async def chunks_of(pieces: list[str], builder: ResponseBuilder, finish: str = "stop") -> list[dict]:
    reply = await reply_channel_get(InMemoryChannelLayer())
    run = JobRun(reply=reply, request_id="r", model="m")
    events = [Delta("r", piece, [i]) for i, piece in enumerate(pieces)] + [Done("r", finish, USAGE)]
    reply.deliver(Batch(events))
    return [chunk async for chunk in job_chunks(run, builder)]


def split(text: str, size: int) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)]


async def test_a_call_streams_in_openais_shape_and_ends_with_tool_calls():
    chunks = await chunks_of(split(CALL, 7), builder())
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": "", "refusal": None}
    deltas = [c["choices"][0]["delta"] for c in chunks[1:-1]]
    assert all(set(d) == {"tool_calls"} for d in deltas), deltas  # no content around a call
    entries = [entry for d in deltas for entry in d["tool_calls"]]
    assert entries[0] == {"index": 0, "id": "call_0", "type": "function",
                          "function": {"name": "get_weather", "arguments": ""}}
    assert all(set(e) == {"index", "function"} and set(e["function"]) == {"arguments"} for e in entries[1:])
    assert json.loads("".join(e["function"]["arguments"] for e in entries[1:])) == {"city": "Paris"}
    assert len(entries) > 2  # the arguments came in pieces
    assert chunks[-1]["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "tool_calls"}


async def test_the_whole_body_has_tool_calls_and_null_content():
    whole = builder(collect=True)
    await chunks_of(split(CALL + "\n" + CALL.replace("get_weather", "now").replace('{"city": "Paris"}', "{}"), 5),
                    whole)
    body = whole.collected(finish_reason="stop", usage=USAGE)
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"] == {"role": "assistant", "content": None, "refusal": None, "annotations": [],
                                 "tool_calls": [
                                     {"id": "call_0", "type": "function",
                                      "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
                                     {"id": "call_1", "type": "function", "function": {"name": "now", "arguments": "{}"}}]}
    assert body["usage"]["completion_tokens"] == 9  # usage unchanged


async def test_text_and_a_call_keep_both_and_a_plain_answer_stays_stop():
    whole = builder(collect=True)
    streamed = await chunks_of(split("Let me check.\n" + CALL, 3), whole)
    message = whole.collected(finish_reason="stop", usage=USAGE)["choices"][0]["message"]
    assert message["content"] == "Let me check." and len(message["tool_calls"]) == 1
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in streamed)
    assert content == "Let me check."
    plain = builder(collect=True)
    chunks = await chunks_of(["It is ", "sunny <b>", " today. "], plain)
    body = plain.collected(finish_reason="stop", usage=USAGE)
    assert body["choices"][0]["finish_reason"] == "stop" and "tool_calls" not in body["choices"][0]["message"]
    assert body["choices"][0]["message"]["content"] == "It is sunny <b> today. "
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


async def test_a_cut_off_call_keeps_length_and_one_call_without_parallel():
    cut = builder(collect=True)
    await chunks_of(split(CALL[:60], 9), cut, finish="length")
    choice = cut.collected(finish_reason="length", usage=USAGE)["choices"][0]
    assert choice["finish_reason"] == "length" and choice["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    single = builder(collect=True, max_calls=1)
    await chunks_of([CALL, "\n", CALL], single)
    assert len(single.collected(finish_reason="stop", usage=USAGE)["choices"][0]["message"]["tool_calls"]) == 1


async def test_without_a_parser_the_tags_are_text():
    whole = builder(names=(), collect=True)
    await chunks_of([CALL], whole)
    choice = whole.collected(finish_reason="stop", usage=USAGE)["choices"][0]
    assert choice["message"]["content"] == CALL and choice["finish_reason"] == "stop"


def _prepared(body):
    request = chat_request_parse(body=body)
    return SimpleNamespace(request=request, request_id="r", created=1, model=SimpleNamespace(name="m"),
                           auth=SimpleNamespace(tier=SimpleNamespace(priority=1)))


def test_the_builder_reads_calls_only_with_tools_and_a_choice_other_than_none():
    assert response_builder(prepared=_prepared(chat(tools=[WEATHER]))).tool_parser is not None
    single = response_builder(prepared=_prepared(chat(tools=[WEATHER], parallel_tool_calls=False))).tool_parser
    assert single.max_calls == 1
    assert response_builder(prepared=_prepared(chat(tools=[WEATHER], tool_choice="none"))).tool_parser is None
    assert response_builder(prepared=_prepared({"model": MODEL, "messages": HISTORY})).tool_parser is None


# ---------------------------------------------------------------- over HTTP: refused before admission
UNENFORCEABLE = {"type": "function", "function": {"name": "tag", "strict": True, "parameters": {
    "type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}}}}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("fields", "param"), [
    ({"tools": [WEATHER, UNENFORCEABLE], "tool_choice": "required"}, "tools[1].function.parameters"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice.function.name"),
    ({"messages": [{"role": "tool", "tool_call_id": "x", "content": "x"}]}, "messages[0].role"),
])
async def test_bad_tools_are_400s_before_anything_is_reserved(asgi_client, key, monkeypatch, fields, param):
    import billing.services.admission_reserve as admission

    async def never(**kwargs):
        raise AssertionError("a refused request reached admission")

    monkeypatch.setattr(admission, "aadmission_reserve", never)
    body = {"model": MODEL, "max_tokens": 8, "messages": MSG, **fields}
    response = await asgi_client.post("/v1/chat/completions", content=json.dumps(body).encode(), headers={
        "Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error", error
    if "parameters" in param:
        assert "uniqueItems" in error["message"] and error["code"] == "invalid_function_parameters"


@pytest.mark.django_db(transaction=True)
async def test_an_unforced_tools_bad_keyword_is_not_compiled(asgi_client, key, monkeypatch):
    """auto: no grammar uses the parameters, so nothing compiles them (the request reaches admission)."""
    import billing.services.admission_reserve as admission
    from common.errors import ServiceUnavailable

    async def reached(**kwargs):
        raise ServiceUnavailable("admission reached", code="reached")

    async def served(model):  # under REDIS_URL no worker serves here: capacity would refuse first
        return None

    monkeypatch.setattr(admission, "aadmission_reserve", reached)
    monkeypatch.setattr("inference.api.services.capacity_check", served)
    body = {"model": MODEL, "max_tokens": 8, "messages": MSG, "tools": [UNENFORCEABLE]}
    response = await asgi_client.post("/v1/chat/completions", content=json.dumps(body).encode(), headers={
        "Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    assert response.json()["error"]["code"] == "reached", response.text
