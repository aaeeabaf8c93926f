"""A revocation in one web process closes a WebSocket open on another, over Redis pub/sub.

Two uvicorn web processes (EMBEDDED_WORKER=0: no engine is needed to
authenticate, revoke and close) on one database and one Redis
(API_E2E_REDIS_URL's database). Both run with the key cache's TTL at 30 s,
so nothing but the pub/sub event (tenants.services.key_events) can tell
process B of a revocation made in process A within the test's bound: without
it B kept the socket open and served the key from its cache.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid

import httpx
import pytest
import redis
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from tests.e2e.processes import (
    api_key_new, database_prepare, postgres_database_reset, process_env, servers_required, wait_until, web_start,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REDIS_URL = os.environ.get("API_E2E_REDIS_URL", "redis://127.0.0.1:6379/3")
CACHE_TTL_S = 30  # far beyond the bound below: only the event can explain a close within it


def _database_url(tmp) -> str:
    url = os.environ.get("DATABASE_URL", "")
    return f"{url}_key_events" if url.startswith("postgres") else f"sqlite:///{tmp / 'key_events.sqlite3'}"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("key_events_e2e")
    database_url = _database_url(tmp)
    if database_url.startswith("postgres"):
        servers_required(database_url=database_url, redis_url=REDIS_URL)
        postgres_database_reset(database_url)
    else:
        try:
            redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
        except redis.RedisError as exc:
            if os.environ.get("CI", "").lower() == "true":
                pytest.fail(f"this test needs Redis under CI: {exc}")
            pytest.skip(f"Redis at {REDIS_URL}: {exc}")
    prefix = f"key-events-{uuid.uuid4().hex[:8]}"
    env = process_env(DATABASE_URL=database_url, REDIS_URL=REDIS_URL, EMBEDDED_WORKER="0", QUEUE_KEY_PREFIX=prefix,
                      ADMISSION_KEY_PREFIX=f"{prefix}-lim", API_KEY_CACHE_TTL_S=str(CACHE_TTL_S))
    database_prepare(env)
    keys = [api_key_new(env, tenant=f"events-{n}", tier="pro") for n in range(2)]
    web_a, url_a = web_start(env, tmp, name="web-a")
    try:
        web_b, url_b = web_start(env, tmp, name="web-b")
    except BaseException:
        web_a.stop()
        raise
    try:
        yield {"a": url_a, "b": url_b, "keys": keys, "procs": (web_a, web_b)}
    finally:
        web_b.stop()
        web_a.stop()


def _subscribers() -> int:
    from tenants.services.key_events import channel_name

    [(_channel, count)] = redis.Redis.from_url(REDIS_URL).pubsub_numsub(channel_name(REDIS_URL))
    return count


async def _recv(ws, timeout: float) -> dict:
    return json.loads(await asyncio.wait_for(ws.recv(), timeout))


def _key_id(url: str, key: str) -> str:
    prefix = key.rsplit("-", 1)[0]
    listed = httpx.get(f"{url}/v1/keys", headers={"Authorization": f"Bearer {key}"}, timeout=30).json()["data"]
    return next(row["id"] for row in listed if row["prefix"] == prefix)


async def test_a_revocation_in_process_a_closes_the_socket_on_process_b(stack):
    key = stack["keys"][0]
    bystander = stack["keys"][1]
    url_b = stack["b"].replace("http://", "ws://") + "/v1/realtime"
    ws = await connect(url_b, additional_headers={"Authorization": f"Bearer {key}"})
    other = await connect(url_b, additional_headers={"Authorization": f"Bearer {bystander}"})
    assert (await _recv(ws, 30))["type"] == "authenticated" and (await _recv(other, 30))["type"] == "authenticated"
    # B verified a key, so its listener started: wait until it is subscribed (what is published before is lost)
    await asyncio.to_thread(wait_until, lambda: _subscribers() >= 1, timeout=30, what="process B's subscription")
    key_id = await asyncio.to_thread(_key_id, stack["a"], key)
    revoked = await asyncio.to_thread(httpx.post, f"{stack['a']}/v1/keys/{key_id}/revoke",
                                      headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert revoked.status_code == 200
    started = time.monotonic()
    frame = await _recv(ws, timeout=10)  # a third of the TTL that bounded this before
    assert frame["type"] == "error" and frame["error"]["code"] == "invalid_api_key", frame
    assert "revoked" in frame["error"]["message"]
    with pytest.raises(ConnectionClosed) as caught:
        await _recv(ws, timeout=10)
    assert caught.value.rcvd.code == 4401
    print(f"process B closed the socket {1000 * (time.monotonic() - started):.0f} ms after A's revoke answered")
    # B's cache was emptied by the event too: REST on B refuses the key now, well within the 30 s TTL
    on_b = await asyncio.to_thread(httpx.post, f"{stack['b']}/v1/chat/completions", timeout=30,
                                   headers={"Authorization": f"Bearer {key}"},
                                   json={"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "hi"}]})
    assert on_b.status_code == 401
    # the other tenant's socket on B was not touched
    await other.send(json.dumps({"type": "ping"}))
    assert await _recv(other, 10) == {"type": "pong"}
    await other.close()
