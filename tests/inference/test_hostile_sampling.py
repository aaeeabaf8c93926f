"""Hostile sampling parameters against a real server (uvicorn, embedded engine, the real model).

`top_k` at or above the vocabulary once crashed the engine step and with it every other
tenant's stream in the batch. Now such a `top_k` means "no top-k filtering" (clamped at
admission) and runs, and token ids outside the vocabulary (`logit_bias`, `stop_token_ids`)
get a 400 naming the parameter, on both endpoints and the WebSocket; never a 500, and another
tenant's stream running meanwhile ends normally.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from websockets.asyncio.client import connect

from tests.e2e.processes import MODEL, embedded_server_shared, usage_record_wait

pytestmark = [pytest.mark.slow]

HUGE_TOP_K = [49152, 50000, 2**31 - 1, 2**63]
OUT_OF_VOCAB = [
    ({"logit_bias": {"49152": 5}}, "logit_bias"),
    ({"logit_bias": {str(2**63): 1}}, "logit_bias"),
    ({"stop_token_ids": [49152]}, "stop_token_ids"),
    ({"stop_token_ids": [2**40]}, "stop_token_ids"),
    ({"stop_token_ids": [-1]}, "stop_token_ids"),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory, pytestconfig):
    return embedded_server_shared(tmp_path_factory, pytestconfig)


def body(endpoint: str, **fields) -> dict:
    if endpoint == "chat/completions":
        return {"model": MODEL, "messages": [{"role": "user", "content": "Say something."}], **fields}
    return {"model": MODEL, "prompt": "Once upon a time", **fields}


async def stream_text(client: httpx.AsyncClient, path: str, key: str, payload: dict) -> tuple[int, list[dict]]:
    """POST a streamed request; (status, the parsed data chunks)."""
    chunks = []
    async with client.stream("POST", path, json={**payload, "stream": True},
                             headers={"Authorization": f"Bearer {key}"}) as response:
        if response.status_code != 200:
            await response.aread()
            return response.status_code, [response.json()]
        async for line in response.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    return response.status_code, chunks


@pytest.mark.parametrize("endpoint", ["chat/completions", "completions"])
async def test_a_huge_top_k_runs_and_another_tenants_stream_is_untouched(server, endpoint):
    path = f"{server.url}/v1/{endpoint}"
    async with httpx.AsyncClient(timeout=300) as client:
        other = asyncio.create_task(stream_text(
            client, path, server.keys["enterprise"],
            body(endpoint, max_tokens=40, temperature=0, ignore_eos=True, stream_options={"include_usage": True})))
        for top_k in HUGE_TOP_K:
            response = await client.post(path, json=body(endpoint, max_tokens=8, temperature=0.8, top_k=top_k),
                                         headers={"Authorization": f"Bearer {server.keys['pro']}"})
            assert response.status_code == 200, (top_k, response.text)
            choice = response.json()["choices"][0]
            assert choice["finish_reason"] in ("stop", "length")
            status, chunks = await stream_text(client, path, server.keys["free"],
                                               body(endpoint, max_tokens=6, top_k=top_k, seed=1))
            assert status == 200 and chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length"), chunks[-1]
        status, chunks = await other
    assert status == 200
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c.get("choices")]
    assert finishes[-1] == "length" and chunks[-1]["usage"]["completion_tokens"] == 40
    records = usage_record_wait(server.database_url, chunks[-1]["id"].split("-", 1)[1])
    assert [r["finish_reason"] for r in records] == ["length"]


@pytest.mark.parametrize("endpoint", ["chat/completions", "completions"])
@pytest.mark.parametrize("fields, param", OUT_OF_VOCAB)
async def test_token_ids_outside_the_vocabulary_are_400_naming_the_parameter(server, endpoint, fields, param):
    async with httpx.AsyncClient(timeout=60) as client:
        for stream in (False, True):
            response = await client.post(f"{server.url}/v1/{endpoint}", json=body(endpoint, stream=stream, **fields),
                                         headers={"Authorization": f"Bearer {server.keys['pro']}"})
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert error["param"] == param and error["type"] == "invalid_request_error"


async def test_the_websocket_runs_a_huge_top_k_and_refuses_out_of_vocabulary_ids(server):
    url = server.url.replace("http://", "ws://") + "/v1/realtime"
    async with connect(url, additional_headers={"Authorization": f"Bearer {server.keys['pro']}"}) as ws:
        assert json.loads(await ws.recv())["type"] == "authenticated"
        for i, top_k in enumerate(HUGE_TOP_K):
            await ws.send(json.dumps({"type": "request", "id": f"k{i}", "endpoint": "chat.completions",
                                      "body": body("chat/completions", max_tokens=5, top_k=top_k, temperature=0.8)}))
        for i, (fields, param) in enumerate(OUT_OF_VOCAB):
            await ws.send(json.dumps({"type": "request", "id": f"v{i}", "endpoint": "completions",
                                      "body": body("completions", max_tokens=5, **fields)}))
        done, errors = {}, {}
        while len(done) < len(HUGE_TOP_K) or len(errors) < len(OUT_OF_VOCAB):
            frame = json.loads(await asyncio.wait_for(ws.recv(), 120))
            if frame["type"] == "done":
                done[frame["id"]] = frame
            elif frame["type"] == "error":
                errors[frame["id"]] = frame["error"]
        assert sorted(done) == [f"k{i}" for i in range(len(HUGE_TOP_K))]
        assert all(frame["finish_reason"] in ("stop", "length") for frame in done.values())
        assert {rid: e["param"] for rid, e in errors.items()} == {
            f"v{i}": param for i, (_, param) in enumerate(OUT_OF_VOCAB)}
