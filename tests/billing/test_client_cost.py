"""The `openai` SDK against a real server reads `usage.model_extra["cost"]`, equal to the record's cost.

Shares the session's embedded server (tests/e2e/processes.py): bootstrap gave
the demo model its list price, so every request is costed.
"""

from __future__ import annotations

from decimal import Decimal

import openai
import pytest

from billing.money import FEMTOS_PER_USD
from tests.e2e.processes import MODEL, embedded_server_shared, usage_record_wait

pytestmark = [pytest.mark.slow]

MESSAGES = [{"role": "user", "content": "Count from one to five."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory, pytestconfig):
    return embedded_server_shared(tmp_path_factory, pytestconfig)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.keys["pro"], max_retries=0, timeout=300)


def _assert_cost_is_the_records(cost: dict, record: dict) -> None:
    assert cost["currency"] == "usd"
    for kind, column in (("input", "input_cost_femtos"), ("cached_input", "cached_input_cost_femtos"),
                         ("output", "output_cost_femtos"), ("total", "cost_femtos")):
        assert Decimal(cost[kind]) == Decimal(record[column]) / FEMTOS_PER_USD, kind
    assert Decimal(cost["total"]) > 0


def test_non_streamed_cost(client, server):
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0)
    completion = raw.parse()
    [record] = usage_record_wait(server.database_url, raw.headers["x-request-id"])
    _assert_cost_is_the_records(completion.usage.model_extra["cost"], record)


def test_streamed_cost_on_the_usage_chunk(client, server):
    stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    [record] = usage_record_wait(server.database_url, stream.response.headers["x-request-id"])
    _assert_cost_is_the_records(chunks[-1].usage.model_extra["cost"], record)
    assert all(chunk.usage is None for chunk in chunks[:-1])


async def test_websocket_done_frames_carry_the_cost_and_a_cancelled_request_pays_for_its_tokens(server):
    import asyncio
    import json

    from websockets.asyncio.client import connect

    from billing.services.prices import DEFAULT_PRICES

    input_price, cached_price, output_price = (Decimal(p) for p in DEFAULT_PRICES[MODEL])  # the pro tier: x1
    ws = await connect(server.url.replace("http://", "ws://") + "/v1/realtime",
                       additional_headers={"Authorization": f"Bearer {server.keys['pro']}"})
    recv = lambda: asyncio.wait_for(ws.recv(), 120)  # noqa: E731
    assert json.loads(await recv())["type"] == "authenticated"
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 200, "ignore_eos": True, "temperature": 0}
    await ws.send(json.dumps({"type": "request", "id": "c1", "endpoint": "chat.completions", "body": body}))
    chunks = 0
    while True:
        frame = json.loads(await recv())
        if frame["type"] == "done":
            break
        chunks += 1
        if chunks == 3:
            await ws.send(json.dumps({"type": "cancel", "id": "c1"}))
    await ws.close()
    usage = frame["usage"]
    assert frame["finish_reason"] == "abort" and 0 < usage["completion_tokens"] < 200
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    cost = usage["cost"]
    assert Decimal(cost["output"]) == usage["completion_tokens"] * output_price / 10**6
    assert Decimal(cost["input"]) == (usage["prompt_tokens"] - cached) * input_price / 10**6
    assert Decimal(cost["cached_input"]) == cached * cached_price / 10**6
    assert Decimal(cost["total"]) == Decimal(cost["input"]) + Decimal(cost["cached_input"]) + Decimal(cost["output"])
