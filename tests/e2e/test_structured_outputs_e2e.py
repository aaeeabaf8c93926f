"""`response_format` end to end, as a user of the official openai SDK sees it: the real model (SmolLM2-135M on
the CPU) behind the real embedded server (uvicorn, its engine thread, SQLite), shared with the other
server-backed tests.

`client.chat.completions.parse(response_format=PydanticModel)` for ten models (nested objects, lists, enums,
Optional fields, bounded numbers, booleans, Literal), greedy and seeded: every reply parses into an instance;
the SDK's streaming helper; one over the WebSocket; json_object; a strict schema with a keyword that cannot be
enforced is a 400 naming it; a max_tokens too small ends with "length". Strings are bounded (max_length) and
max_tokens small, so that a small model's output stays short.
"""

from __future__ import annotations

import asyncio
import enum
import json
from typing import Literal, Optional

import openai
import pytest
from pydantic import BaseModel, Field
from websockets.asyncio.client import connect

from tests.e2e.processes import MODEL, embedded_server_shared, usage_record_wait, usage_records

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MAX_TOKENS = 96


class Person(BaseModel):
    name: str = Field(max_length=16)
    age: int = Field(ge=0, le=120)


class Color(str, enum.Enum):
    red = "red"
    green = "green"
    blue = "blue"


class Fruit(BaseModel):
    name: str = Field(max_length=12)
    color: Color


class Address(BaseModel):
    city: str = Field(max_length=16)
    country: str = Field(max_length=16)


class Customer(BaseModel):
    name: str = Field(max_length=16)
    address: Address


class Shopping(BaseModel):
    items: list[str] = Field(min_length=1, max_length=3)


class Book(BaseModel):
    title: str = Field(max_length=20)
    subtitle: Optional[str] = Field(max_length=20)


class Measurement(BaseModel):
    value: float = Field(ge=0, le=1)
    count: int = Field(ge=1, le=10)


class Flags(BaseModel):
    done: bool
    urgent: bool


class Sentiment(BaseModel):
    label: Literal["positive", "negative", "neutral"]


class Member(BaseModel):
    name: str = Field(max_length=12)
    role: Literal["lead", "dev"]


class Team(BaseModel):
    members: list[Member] = Field(min_length=1, max_length=2)


class Event(BaseModel):
    title: str = Field(max_length=16)
    year: int = Field(ge=1900, le=2100)
    tags: list[Color] = Field(max_length=2)
    confirmed: bool
    score: Optional[float] = Field(ge=-5, le=5)


CASES = [
    (Person, "Invent a person and give their name and age."),
    (Fruit, "Name a fruit and its colour."),
    (Customer, "Invent a customer with a city and a country."),
    (Shopping, "List up to three things to buy at a grocery store."),
    (Book, "Name a famous book."),
    (Measurement, "Give a probability between 0 and 1 and a count from 1 to 10."),
    (Flags, "Is the task done? Is it urgent?"),
    (Sentiment, "What is the sentiment of: 'I love this!'"),
    (Team, "Describe a small software team."),
    (Event, "Describe a concert."),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory, pytestconfig):
    return embedded_server_shared(tmp_path_factory, pytestconfig)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.keys["pro"], max_retries=0, timeout=300)


def messages(prompt: str) -> list[dict]:
    return [{"role": "system", "content": "You answer in JSON."}, {"role": "user", "content": prompt}]


def test_parse_pydantic_models_greedy_and_seeded(server):
    """The 21 requests at once (the engine batches them: about one request's steps, not twenty's)."""
    client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=server.keys["pro"], max_retries=0, timeout=600)
    runs = [(model, prompt, sampling) for model, prompt in CASES
            for sampling in ({"temperature": 0}, {"temperature": 0.8, "seed": 7})]
    runs.append((Person, CASES[0][1], {"temperature": 0.8, "seed": 7}))  # the same seed again: the same text

    async def parse(model, prompt, sampling):
        try:
            return await client.chat.completions.parse(model=MODEL, messages=messages(prompt), response_format=model,
                                                       max_tokens=MAX_TOKENS, **sampling)
        except openai.LengthFinishReasonError as exc:  # reported below with its text
            return exc.completion

    async def run_all():
        async with client:
            return await asyncio.gather(*(parse(*run) for run in runs))

    completions = asyncio.run(run_all())
    assert completions[-1].choices[0].message.content == completions[1].choices[0].message.content
    for (model, _, sampling), completion in zip(runs, completions):
        choice = completion.choices[0]
        assert choice.finish_reason == "stop", (model.__name__, sampling, choice.message.content)
        assert isinstance(choice.message.parsed, model), choice.message.content
        assert choice.message.refusal is None
        assert json.loads(choice.message.content) == choice.message.parsed.model_dump(mode="json")
        assert completion.usage.completion_tokens > 0


def test_the_ten_models_streamed_parse_too(server):
    """The streaming helper on each of the ten models at once (greedy): every final completion parses."""
    client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=server.keys["pro"], max_retries=0, timeout=600)

    async def stream(model, prompt):
        async with client.chat.completions.stream(model=MODEL, messages=messages(prompt), response_format=model,
                                                  max_tokens=MAX_TOKENS, temperature=0) as events:
            deltas = [event.delta async for event in events if event.type == "content.delta"]
            return deltas, await events.get_final_completion()

    async def run_all():
        async with client:
            return await asyncio.gather(*(stream(model, prompt) for model, prompt in CASES))

    for (model, _), (deltas, final) in zip(CASES, asyncio.run(run_all())):
        choice = final.choices[0]
        assert choice.finish_reason == "stop", (model.__name__, choice.message.content)
        assert isinstance(choice.message.parsed, model) and "".join(deltas) == choice.message.content


def test_stream_helper_parses_the_final_completion(client, server):
    with client.chat.completions.stream(model=MODEL, messages=messages("Invent a customer."), response_format=Customer,
                                        max_tokens=MAX_TOKENS, temperature=0) as stream:
        deltas = [event.delta for event in stream if event.type == "content.delta"]
        final = stream.get_final_completion()
    message = final.choices[0].message
    assert isinstance(message.parsed, Customer) and final.choices[0].finish_reason == "stop"
    assert "".join(deltas) == message.content and len(deltas) > 1
    whole = client.chat.completions.parse(model=MODEL, messages=messages("Invent a customer."),
                                          response_format=Customer, max_tokens=MAX_TOKENS, temperature=0)
    assert whole.choices[0].message.content == message.content  # streamed or not, the same text


def test_over_the_websocket(server):
    async def run() -> tuple[str, dict]:
        url = server.url.replace("http://", "ws://") + "/v1/realtime"
        async with connect(url, additional_headers={"Authorization": f"Bearer {server.keys['pro']}"}) as ws:
            assert json.loads(await ws.recv())["type"] == "authenticated"
            body = {"model": MODEL, "messages": messages("Name a fruit and its colour."), "max_tokens": MAX_TOKENS,
                    "temperature": 0, "response_format": {"type": "json_schema", "json_schema": {
                        "name": "fruit", "strict": True, "schema": openai.pydantic_function_tool(Fruit)[
                            "function"]["parameters"]}}}
            await ws.send(json.dumps({"type": "request", "id": "f", "endpoint": "chat.completions", "body": body}))
            text = ""
            while True:
                frame = json.loads(await asyncio.wait_for(ws.recv(), 120))
                assert frame["type"] in ("chunk", "done"), frame
                if frame["type"] == "done":
                    return text, frame
                text += "".join(choice["delta"].get("content") or "" for choice in frame["data"]["choices"])

    text, done = asyncio.run(run())
    assert done["finish_reason"] == "stop", text
    assert isinstance(Fruit.model_validate_json(text), Fruit)
    # a bad schema over the socket is an error frame naming it, the socket stays open
    async def bad() -> dict:
        url = server.url.replace("http://", "ws://") + "/v1/realtime"
        async with connect(url, additional_headers={"Authorization": f"Bearer {server.keys['pro']}"}) as ws:
            await ws.recv()
            body = {"model": MODEL, "messages": messages("x"), "max_tokens": 4, "response_format": {
                "type": "json_schema", "json_schema": {"name": "x", "strict": True, "schema": {
                    "type": "array", "uniqueItems": True}}}}
            await ws.send(json.dumps({"type": "request", "id": "b", "endpoint": "chat.completions", "body": body}))
            return json.loads(await asyncio.wait_for(ws.recv(), 60))

    frame = asyncio.run(bad())
    assert frame["type"] == "error" and frame["error"]["param"] == "response_format", frame
    assert "uniqueItems" in frame["error"]["message"]


def test_json_object(client):
    completion = client.chat.completions.create(
        model=MODEL, messages=messages('Reply with a JSON object with the key "capital" for France.'),
        response_format={"type": "json_object"}, max_tokens=MAX_TOKENS, temperature=0)
    choice = completion.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    assert isinstance(json.loads(choice.message.content), dict)


def test_completions_endpoint_takes_response_format(client):
    completion = client.completions.create(
        model=MODEL, prompt="A person, as JSON:", max_tokens=MAX_TOKENS, temperature=0,
        extra_body={"response_format": {"type": "json_schema", "json_schema": {
            "name": "person", "schema": Person.model_json_schema()}}})
    assert completion.choices[0].finish_reason == "stop", completion.choices[0].text
    Person.model_validate_json(completion.choices[0].text)


def test_unenforceable_keyword_with_strict_is_a_400_naming_it(client, server):
    schema = {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 10},
                                                        "uniqueItems": True, "maxItems": 3}},
              "required": ["tags"], "additionalProperties": False}
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=messages("Tags?"), max_tokens=8, response_format={
            "type": "json_schema", "json_schema": {"name": "tags", "strict": True, "schema": schema}})
    error = caught.value.body
    assert caught.value.status_code == 400 and error["param"] == "response_format", error
    assert "uniqueItems" in error["message"]
    request_id = caught.value.response.headers["x-request-id"]
    assert usage_records(server.database_url, request_id) == []  # refused before admission: nothing reserved or billed
    # strict false: ignored, the rest enforced
    completion = client.chat.completions.create(model=MODEL, max_tokens=MAX_TOKENS,
                                                messages=messages("Give three tags for a blog post about cats."),
                                                temperature=0, response_format={"type": "json_schema", "json_schema": {
                                                    "name": "tags", "strict": False, "schema": schema}})
    assert isinstance(json.loads(completion.choices[0].message.content)["tags"], list)


def test_bad_shapes_are_400s_with_their_param(client):
    cases = [
        ({"type": "json_schema"}, "response_format.json_schema"),
        ({"type": "json_schema", "json_schema": {"schema": {}}}, "response_format.json_schema.name"),
        ({"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}}, "response_format.json_schema.name"),
        ({"type": "yaml"}, "response_format.type"),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strnig"}}}, "response_format"),
    ]
    for response_format, param in cases:
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model=MODEL, messages=messages("x"), max_tokens=4,
                                           response_format=response_format)
        assert caught.value.body["param"] == param, (response_format, caught.value.body)


def test_max_tokens_too_small_ends_with_length(client, server):
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages("Invent a person."), max_tokens=3, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "strict": True,
                                                                "schema": Person.model_json_schema()}})
    completion = raw.parse()
    choice = completion.choices[0]
    assert choice.finish_reason == "length" and completion.usage.completion_tokens == 3
    assert choice.message.content.startswith("{")  # incomplete JSON, as OpenAI's
    with pytest.raises(openai.LengthFinishReasonError):
        client.chat.completions.parse(model=MODEL, messages=messages("Invent a person."), max_tokens=3,
                                      response_format=Person)
    [record] = usage_record_wait(server.database_url, raw.headers["x-request-id"])
    assert record["finish_reason"] == "length" and record["completion_tokens"] == 3
