"""Tool calling end to end, as users of the official openai SDK and of LangChain (`langchain-openai`) see it:
the real model (SmolLM2-135M on the CPU, whose template has no tool format: the generic
`<tool_call>` one) behind the real embedded server, shared with the other server-backed tests.

`tool_choice` required and named give calls that parse, not streamed and streamed (the SDK's streaming helper
assembles them); a loop with two tools (a forced call, its result back as a `tool` message, then an answer);
`pydantic_function_tool` with `parse(tools=...)` gives parsed arguments; the same over the WebSocket. Argument
strings are bounded (maxLength) and max_tokens small, so that a small model's output stays short.
"""

from __future__ import annotations

import asyncio
import json

import openai
import pytest
from pydantic import BaseModel, Field
from websockets.asyncio.client import connect

from tests.e2e.processes import MODEL, embedded_server_shared

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MAX_TOKENS = 64
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                   "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The current time in a timezone.",
    "parameters": {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 20}},
                   "required": ["timezone"], "additionalProperties": False}}}
NAMES = {"get_weather", "get_time"}


class GetWeather(BaseModel):
    """The current weather in a city."""

    city: str = Field(max_length=20)


class Answer(BaseModel):
    city: str = Field(max_length=20)
    sunny: bool


@pytest.fixture(scope="module")
def server(tmp_path_factory, pytestconfig):
    return embedded_server_shared(tmp_path_factory, pytestconfig)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.keys["pro"], max_retries=0, timeout=300)


def messages(prompt: str = "What is the weather in Paris?") -> list[dict]:
    return [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": prompt}]


def assert_calls(message, names=NAMES) -> list:
    assert message.tool_calls, message
    for call in message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_") and call.function.name in names
        assert isinstance(json.loads(call.function.arguments), dict)
    return message.tool_calls


def test_required_and_named_give_calls_that_parse(client):
    completion = client.chat.completions.create(model=MODEL, messages=messages(), tools=[WEATHER, TIME],
                                                tool_choice="required", max_tokens=MAX_TOKENS, temperature=0)
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message
    assert choice.message.content is None
    calls = assert_calls(choice.message)
    named = client.chat.completions.create(
        model=MODEL, messages=messages("What time is it in Tokyo?"), tools=[WEATHER, TIME], parallel_tool_calls=False,
        tool_choice={"type": "function", "function": {"name": "get_time"}}, max_tokens=MAX_TOKENS, temperature=0)
    choice = named.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message
    assert [call.function.name for call in assert_calls(choice.message)] == ["get_time"]
    assert "timezone" in json.loads(choice.message.tool_calls[0].function.arguments)
    assert completion.usage.completion_tokens > 0 and calls


def test_the_stream_helper_assembles_streamed_calls(client):
    kwargs = dict(model=MODEL, messages=messages(), tools=[WEATHER, TIME], tool_choice="required",
                  max_tokens=MAX_TOKENS, temperature=0)
    with client.chat.completions.stream(**kwargs) as stream:
        events = list(stream)
        final = stream.get_final_completion()
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = assert_calls(choice.message)
    done = [event for event in events if event.type == "tool_calls.function.arguments.done"]
    assert [event.arguments for event in done] == [call.function.arguments for call in calls]
    assert sum(event.type == "tool_calls.function.arguments.delta" for event in events) >= 1
    whole = client.chat.completions.create(**kwargs)  # streamed or not, the same calls
    assert [(c.function.name, c.function.arguments) for c in whole.choices[0].message.tool_calls] == [
        (c.function.name, c.function.arguments) for c in calls]
    # the raw chunks: a call's first entry has index, id, type, name and arguments ""; then index + arguments
    raw = client.chat.completions.create(**kwargs, stream=True)
    entries = [entry for chunk in raw for choice in chunk.choices for entry in (choice.delta.tool_calls or [])]
    first = entries[0]
    assert first.index == 0 and first.id.startswith("call_") and first.type == "function"
    assert first.function.name in NAMES and first.function.arguments == ""
    assert all(e.id is None and e.function.name is None for e in entries[1:] if e.index == 0)


def test_a_two_tool_loop_answers_after_the_tool_result(client):
    history = messages("What is the weather in Paris?")
    first = client.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER, TIME],
                                           tool_choice="required", parallel_tool_calls=False,
                                           max_tokens=MAX_TOKENS, temperature=0)
    call = assert_calls(first.choices[0].message)[0]
    history.append(first.choices[0].message.model_dump(exclude_none=True, include={"role", "content", "tool_calls"}))
    history.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps({"weather": "sunny, 21 C"})})
    answer = client.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER, TIME], tool_choice="none",
                                            max_tokens=MAX_TOKENS, temperature=0)
    choice = answer.choices[0]
    assert choice.finish_reason in ("stop", "length") and choice.message.tool_calls is None
    assert choice.message.content
    # auto after the result: an answer in text or another call, either well formed
    auto = client.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER, TIME],
                                          max_tokens=MAX_TOKENS, temperature=0)
    choice = auto.choices[0]
    if choice.finish_reason == "tool_calls":
        assert_calls(choice.message)
    else:
        assert choice.message.content and choice.message.tool_calls is None


def test_parse_with_a_pydantic_function_tool(client):
    completion = client.chat.completions.parse(model=MODEL, messages=messages(),
                                               tools=[openai.pydantic_function_tool(GetWeather)],
                                               tool_choice="required", max_tokens=MAX_TOKENS, temperature=0)
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    parsed = choice.message.tool_calls[0].function.parsed_arguments
    assert isinstance(parsed, GetWeather), choice.message


def test_over_the_websocket(server):
    async def run() -> tuple[list[dict], dict, str | None]:
        url = server.url.replace("http://", "ws://") + "/v1/realtime"
        async with connect(url, additional_headers={"Authorization": f"Bearer {server.keys['pro']}"}) as ws:
            assert json.loads(await ws.recv())["type"] == "authenticated"
            body = {"model": MODEL, "messages": messages(), "max_tokens": MAX_TOKENS, "temperature": 0,
                    "tools": [WEATHER, TIME], "tool_choice": "required"}
            await ws.send(json.dumps({"type": "request", "id": "t", "endpoint": "chat.completions", "body": body}))
            entries, last = [], None
            while True:
                frame = json.loads(await asyncio.wait_for(ws.recv(), 120))
                assert frame["type"] in ("chunk", "done"), frame
                if frame["type"] == "done":
                    return entries, frame, last
                for choice in frame["data"]["choices"]:
                    entries += choice["delta"].get("tool_calls") or []
                    last = choice["finish_reason"] or last

    entries, done, last = asyncio.run(run())
    assert done["finish_reason"] == "tool_calls" and last == "tool_calls", done
    assert entries[0]["id"].startswith("call_") and entries[0]["function"]["arguments"] == ""
    arguments = "".join(e["function"]["arguments"] for e in entries if e["index"] == 0)
    assert isinstance(json.loads(arguments), dict) and entries[0]["function"]["name"] in NAMES


# ---------------------------------------------------------------- LangChain (langchain-openai, a test dependency)
def _chat_model(server):
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(base_url=f"{server.url}/v1", api_key=server.keys["pro"], model=MODEL,
                      temperature=0, max_tokens=MAX_TOKENS, max_retries=0, timeout=300)


def test_langchain_bind_tools_loop(server):
    from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage
    from langchain_core.tools import tool

    @tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        return "sunny, 21 C"

    @tool
    def get_time(timezone: str) -> str:
        """The current time in a timezone."""
        return "12:00"

    llm = _chat_model(server)
    history = [SystemMessage("You are a helpful assistant."), HumanMessage("What is the weather in Paris?")]
    reply = llm.bind_tools([get_weather, get_time], tool_choice="any").invoke(history)
    assert reply.tool_calls and all(call["name"] in NAMES for call in reply.tool_calls), reply
    history.append(reply)
    for call in reply.tool_calls:  # every call answered (the server refuses a history that leaves one open)
        result = {"get_weather": get_weather, "get_time": get_time}[call["name"]].invoke(call["args"])
        history.append(ToolMessage(result, tool_call_id=call["id"]))
    answer = llm.bind_tools([get_weather, get_time], tool_choice="none").invoke(history)
    assert answer.content and not answer.tool_calls, answer


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_langchain_with_structured_output(server, method):
    llm = _chat_model(server)
    structured = llm.with_structured_output(Answer, method=method)
    answer = structured.invoke("Is it sunny in Paris? Answer with the city and whether it is sunny.")
    assert isinstance(answer, Answer), answer
