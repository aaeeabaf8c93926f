"""WebSocket /v1/realtime against the real embedded server (shared with the SDK tests).

Concurrent requests on one socket, cancelling one, bad frames answered with
error frames (the socket stays usable), and a dropped socket cancelling its work.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from openai.types.chat import ChatCompletionChunk
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from tests.e2e.processes import MODEL, embedded_server_shared, usage_record_wait

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def server(tmp_path_factory, pytestconfig):
    return embedded_server_shared(tmp_path_factory, pytestconfig)


def ws_url(server) -> str:
    return server.url.replace("http://", "ws://") + "/v1/realtime"


async def recv(ws, timeout: float = 120) -> dict:
    return json.loads(await asyncio.wait_for(ws.recv(), timeout))


async def authed(server, tier: str = "pro"):
    ws = await connect(ws_url(server), additional_headers={"Authorization": f"Bearer {server.keys[tier]}"})
    hello = await recv(ws)
    assert hello == {"type": "authenticated", "tenant": f"t-{tier}", "tier": tier}
    return ws


def chat_body(content: str, **fields) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **fields}


async def test_two_concurrent_requests_and_cancel_one(server):
    ws = await authed(server)
    long = chat_body("Tell me a long story about a lighthouse.", max_tokens=200, temperature=0.8, seed=1, ignore_eos=True)
    short = {"model": MODEL, "prompt": "The three primary colours are", "max_tokens": 12, "temperature": 0}
    await ws.send(json.dumps({"type": "request", "id": "long", "endpoint": "chat.completions", "body": long}))
    await ws.send(json.dumps({"type": "request", "id": "short", "endpoint": "completions", "body": short}))
    texts = {"long": "", "short": ""}
    content_chunks = {"long": 0, "short": 0}
    done = {}
    cancelled = False
    while len(done) < 2:
        frame = await recv(ws)
        assert frame["type"] in ("chunk", "done"), frame
        rid = frame["id"]
        if frame["type"] == "done":
            done[rid] = frame
            continue
        if rid == "long":
            chunk = ChatCompletionChunk.model_validate(frame["data"])
            delta = chunk.choices[0].delta.content or ""
        else:
            assert frame["data"]["object"] == "text_completion"
            delta = frame["data"]["choices"][0]["text"]
        texts[rid] += delta
        content_chunks[rid] += bool(delta)
        if rid == "long" and content_chunks["long"] == 3 and not cancelled:
            await ws.send(json.dumps({"type": "cancel", "id": "long"}))
            cancelled = True
    assert done["short"]["finish_reason"] in ("stop", "length") and texts["short"]
    assert done["short"]["usage"]["completion_tokens"] > 0
    assert done["long"]["finish_reason"] == "abort"
    assert 3 <= done["long"]["usage"]["completion_tokens"] < 200
    # the socket is still usable, and the same id may be reused once finished
    await ws.send(json.dumps({"type": "request", "id": "long", "endpoint": "chat.completions",
                              "body": chat_body("Hi", max_tokens=2)}))
    frames = [await recv(ws)]
    while frames[-1]["type"] != "done":
        frames.append(await recv(ws))
    assert frames[0]["data"]["choices"][0]["delta"]["role"] == "assistant"
    assert frames[-1]["usage"]["total_tokens"] > 0
    await ws.close()


async def test_bad_frames_get_error_frames_and_the_socket_stays_open(server):
    ws = await connect(ws_url(server))
    await ws.send("this is not json")
    assert (await recv(ws))["error"]["code"] == "invalid_json"
    await ws.send(b"\x00\x01binary")
    assert (await recv(ws))["error"]["code"] == "invalid_frame"
    await ws.send(json.dumps({"type": "request", "id": "early", "endpoint": "completions", "body": {}}))
    frame = await recv(ws)
    assert frame["id"] == "early" and frame["error"]["code"] == "invalid_api_key"
    await ws.send(json.dumps({"type": "auth", "api_key": server.keys["free"]}))
    assert (await recv(ws))["type"] == "authenticated"
    bad = [
        ({"type": "nonsense"}, "type", None),
        ([1, 2, 3], None, None),
        ({"no": "type"}, "type", None),
        ({"type": "request", "endpoint": "completions", "body": {}}, "id", None),
        ({"type": "request", "id": "x" * 500, "endpoint": "completions", "body": {}}, "id", None),
        ({"type": "request", "id": "a", "endpoint": "images", "body": {}}, "endpoint", "a"),
        ({"type": "request", "id": "a", "endpoint": "completions", "body": "prompt"}, "body", "a"),
        ({"type": "request", "id": "a", "endpoint": "completions", "body": {"model": MODEL}}, "prompt", "a"),
        ({"type": "request", "id": "b", "endpoint": "chat.completions",
          "body": chat_body("x", temperature="hot")}, "temperature", "b"),
        ({"type": "request", "id": "c", "endpoint": "chat.completions",
          "body": {"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]}}, "model", "c"),
        ({"type": "request", "id": "d", "endpoint": "chat.completions",
          "body": chat_body("x", max_tokens=100_000)}, "max_tokens", "d"),
        ({"type": "cancel", "id": "never-started"}, "id", None),
        ({"type": "auth", "api_key": server.keys["pro"]}, "type", None),
    ]
    for frame, param, rid in bad:
        await ws.send(json.dumps(frame))
        reply = await recv(ws)
        assert reply["type"] == "error", (frame, reply)
        assert set(reply["error"]) == {"message", "type", "param", "code"}
        assert reply["error"]["param"] == param, (frame, reply)
        assert reply.get("id") == rid
    await ws.send(json.dumps({"type": "ping"}))
    assert await recv(ws) == {"type": "pong"}
    await ws.close()


async def test_duplicate_running_id_is_refused(server):
    ws = await authed(server)
    body = chat_body("Count slowly to fifty.", max_tokens=16, ignore_eos=True)
    await ws.send(json.dumps({"type": "request", "id": "same", "endpoint": "chat.completions", "body": body}))
    await ws.send(json.dumps({"type": "request", "id": "same", "endpoint": "chat.completions", "body": body}))
    errors, done = [], None
    while done is None:
        frame = await recv(ws)
        if frame["type"] == "error":
            errors.append(frame)
        elif frame["type"] == "done":
            done = frame
    assert [e["error"]["param"] for e in errors] == ["id"]
    assert done["usage"]["completion_tokens"] == 16
    await ws.close()


async def test_bad_key_in_header_closes_with_4401(server):
    ws = await connect(ws_url(server), additional_headers={"Authorization": "Bearer sk-not-a-key"})
    frame = await recv(ws)
    assert frame["type"] == "error" and frame["error"]["code"] == "invalid_api_key"
    with pytest.raises(ConnectionClosed) as caught:
        await recv(ws, timeout=10)
    assert caught.value.rcvd.code == 4401


async def test_dropping_the_socket_cancels_its_requests(server):
    ws = await authed(server)
    body = chat_body("Describe every planet in detail.", max_tokens=300, ignore_eos=True)
    await ws.send(json.dumps({"type": "request", "id": "r1", "endpoint": "chat.completions", "body": body}))
    request_id = None
    while True:
        frame = await recv(ws)
        if frame["type"] == "chunk" and frame["data"]["choices"][0]["delta"].get("content"):
            request_id = frame["data"]["id"].removeprefix("chatcmpl-")
            break
    await ws.close()
    [record] = await asyncio.to_thread(usage_record_wait, server.database_url, request_id)
    assert record["finish_reason"] == "abort" and 1 <= record["completion_tokens"] < 300
