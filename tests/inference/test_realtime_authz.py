"""Every frame of /v1/realtime is authorized as a REST request is, against the real embedded server.

Issue 35, finding 1: a socket authenticated once kept its key's context for
ever, so a revoked or expired key, a suspended tenant and a downgraded tier
were served (and billed as before) for as long as the socket stayed open. Now
each frame re-checks the key, and a change made in this process (the REST
revoke, the admin's actions) or the key's expiry closes the socket at once:
an error frame with the REST code, then 4401 (401) or 4403 (403). Each tenant
here is the test's own (the server is shared with other modules). Also
finding 3 (a limited key's child is limited) and finding 6 (frames limited
like REST bodies, in size and nesting).

The same across web processes (Redis pub/sub): tests/e2e/test_realtime_key_events.py.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import time

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from tests.e2e.processes import MODEL, api_key_new, embedded_server_shared, manage, usage_record_wait

pytestmark = [pytest.mark.slow]

ADMIN_PASSWORD = "e2e-admin-password-1"  # tests.e2e.processes.database_prepare
_names = itertools.count(1)


@pytest.fixture(scope="module")
def server(tmp_path_factory, pytestconfig):
    return embedded_server_shared(tmp_path_factory, pytestconfig)


def fresh_key(server, tier: str = "pro") -> tuple[str, str]:
    """(tenant slug, key): a tenant of this test alone, on `tier`."""
    slug = f"authz-{tier}-{next(_names)}-{int(time.time() * 1000) % 100000}"
    return slug, api_key_new(server.env, tenant=slug, tier=tier)


def ws_url(server) -> str:
    return server.url.replace("http://", "ws://") + "/v1/realtime"


async def recv(ws, timeout: float = 120) -> dict:
    return json.loads(await asyncio.wait_for(ws.recv(), timeout))


async def authed(server, key: str, tier: str):
    ws = await connect(ws_url(server), additional_headers={"Authorization": f"Bearer {key}"})
    hello = await recv(ws)
    assert hello["type"] == "authenticated" and hello["tier"] == tier, hello
    return ws


async def closed_with(ws, timeout: float = 30) -> int:
    with pytest.raises(ConnectionClosed) as caught:
        await recv(ws, timeout=timeout)
    return caught.value.rcvd.code


def request_frame(rid: str, *, max_tokens: int = 2, content: str = "Say hi.", **fields) -> str:
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, **fields}
    return json.dumps({"type": "request", "id": rid, "endpoint": "chat.completions", "body": body}, ensure_ascii=False)


async def served(ws, rid: str) -> tuple[dict, str]:
    """Read `rid`'s frames to its done frame: (done, the request id the server gave it)."""
    request_id = None
    while True:
        frame = await recv(ws)
        assert frame["type"] in ("chunk", "done") and frame["id"] == rid, frame
        if frame["type"] == "chunk":
            request_id = frame["data"]["id"].removeprefix("chatcmpl-")
        else:
            return frame, request_id


def rest(server, method: str, path: str, key: str, **kwargs) -> httpx.Response:
    return httpx.request(method, f"{server.url}{path}", headers={"Authorization": f"Bearer {key}"}, timeout=120,
                         **kwargs)


def key_id(server, key: str) -> str:
    prefix = key.rsplit("-", 1)[0]
    [row] = [k for k in rest(server, "GET", "/v1/keys", key).json()["data"] if k["prefix"] == prefix]
    return row["id"]


def sql(server, statement: str, *params):
    """A statement on the server's database, behind its back (no signal, no event: only the cache's TTL)."""
    url = server.database_url
    if url.startswith("sqlite:///"):
        import sqlite3

        with sqlite3.connect(url[len("sqlite:///"):], timeout=30) as conn:
            return conn.execute(statement, params).fetchall()
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        cursor = conn.execute(statement.replace("?", "%s"), params)
        return cursor.fetchall() if cursor.description else []


def row_id(server, table: str, column: str, value: str) -> int:
    return sql(server, f"SELECT id FROM {table} WHERE {column} = ?", value)[0][0]


class Admin:
    """The Django admin over HTTP, logged in as the bootstrap operator: the issue's suspension and tier change."""

    def __init__(self, server) -> None:
        self.url = server.url
        self.http = httpx.Client(base_url=server.url, timeout=60, follow_redirects=False)
        page = self.http.get("/admin/login/")
        response = self.http.post("/admin/login/?next=/admin/", data={
            "username": "admin", "password": ADMIN_PASSWORD, "next": "/admin/", "csrfmiddlewaretoken": _csrf(page.text)})
        assert response.status_code == 302, response.text[:500]

    def action(self, model: str, action: str, pk: int, **fields) -> None:
        page = self.http.get(f"/admin/tenants/{model}/")
        response = self.http.post(f"/admin/tenants/{model}/", data={
            "action": action, "_selected_action": str(pk), "csrfmiddlewaretoken": _csrf(page.text), **fields})
        assert response.status_code in (200, 302), response.text[:500]


def _csrf(html: str) -> str:
    return re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html).group(1)


@pytest.fixture(scope="module")
def admin(server):
    return Admin(server)


# ---------------------------------------------------------------- finding 1: changes close the socket at once
async def test_revoking_the_key_closes_its_socket_and_cancels_its_requests(server):
    """The REST revoke: the open socket is told (REST's 401 code) and closed with 4401, without sending
    anything; its running request is cancelled and billed what it generated."""
    _slug, key = fresh_key(server)
    ws = await authed(server, key, "pro")
    await ws.send(request_frame("long", max_tokens=300, content="Tell me a long story.", ignore_eos=True))
    request_id = None
    while request_id is None:
        frame = await recv(ws)
        if frame["type"] == "chunk" and frame["data"]["choices"][0]["delta"].get("content"):
            request_id = frame["data"]["id"].removeprefix("chatcmpl-")
    revoke = await asyncio.to_thread(rest, server, "POST", f"/v1/keys/{key_id(server, key)}/revoke", key)
    assert revoke.status_code == 200
    frame = await recv(ws)
    while frame["type"] == "chunk":  # chunks already on their way
        frame = await recv(ws)
    assert frame["type"] == "error" and frame["error"]["code"] == "invalid_api_key", frame
    assert "revoked" in frame["error"]["message"]
    assert await closed_with(ws) == 4401
    [record] = await asyncio.to_thread(usage_record_wait, server.database_url, request_id)
    assert record["finish_reason"] == "abort" and 1 <= record["completion_tokens"] < 300
    assert (await asyncio.to_thread(rest, server, "GET", "/v1/models", key)).status_code == 401


async def test_suspending_the_tenant_in_the_admin_closes_its_sockets_with_4403(server, admin):
    slug, key = fresh_key(server)
    ws = await authed(server, key, "pro")
    await ws.send(request_frame("before"))
    assert (await served(ws, "before"))[0]["finish_reason"] in ("stop", "length")
    await asyncio.to_thread(admin.action, "tenant", "suspend", row_id(server, "tenants_tenant", "slug", slug))
    frame = await recv(ws)
    assert frame["type"] == "error" and frame["error"]["code"] == "tenant_suspended", frame
    assert frame["error"]["type"] == "permission_error"
    assert await closed_with(ws) == 4403
    refused = await asyncio.to_thread(rest, server, "POST", "/v1/chat/completions", key, json={
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
    assert refused.status_code == 403 and refused.json()["error"]["code"] == frame["error"]["code"]


async def test_a_tier_downgrade_applies_to_the_next_frame_and_bills_at_the_new_tier(server, admin):
    """REST refuses max_tokens 600 on free; so does the socket once its tenant moved from pro to free, and
    what it serves then is billed as free."""
    slug, key = fresh_key(server, "pro")
    ws = await authed(server, key, "pro")
    await ws.send(request_frame("on-pro", max_tokens=600))
    first = await recv(ws)
    assert first["type"] == "chunk", first  # admitted on pro
    await ws.send(json.dumps({"type": "cancel", "id": "on-pro"}))
    while (await recv(ws))["type"] != "done":
        pass
    free_tier = row_id(server, "tenants_tier", "name", "free")
    await asyncio.to_thread(admin.action, "tenant", "change_tier", row_id(server, "tenants_tenant", "slug", slug),
                            apply="1", tier=str(free_tier))
    await ws.send(request_frame("on-free", max_tokens=600))
    refused = await recv(ws)
    assert refused["type"] == "error" and refused["id"] == "on-free", refused
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 600}
    as_rest = await asyncio.to_thread(rest, server, "POST", "/v1/chat/completions", key, json=body)
    assert as_rest.status_code == 400 and refused["error"] == as_rest.json()["error"]
    assert refused["error"]["param"] == "max_tokens" and "'free' tier" in refused["error"]["message"]
    await ws.send(request_frame("small"))
    done, request_id = await served(ws, "small")
    [record] = await asyncio.to_thread(usage_record_wait, server.database_url, request_id)
    assert record["tier"] == "free" and record["completion_tokens"] == done["usage"]["completion_tokens"]
    await ws.close()


async def test_a_key_expiring_while_the_socket_is_open_closes_it(server):
    """A key made to expire in a few seconds (through the keys API): served before, then told and closed at
    its expiry without any frame."""
    _slug, parent = fresh_key(server)
    warm = await asyncio.to_thread(rest, server, "POST", "/v1/chat/completions", parent, json={
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})  # the engine is up
    assert warm.status_code == 200
    made = await asyncio.to_thread(rest, server, "POST", "/v1/keys", parent,
                                   json={"name": "short-lived", "expires_at": int(time.time()) + 15})
    assert made.status_code == 201
    key = made.json()["key"]
    ws = await authed(server, key, "pro")
    await ws.send(request_frame("before"))
    assert (await served(ws, "before"))[0]["usage"]["completion_tokens"] > 0
    frame = await recv(ws, timeout=60)
    assert frame["type"] == "error" and frame["error"]["code"] == "invalid_api_key", frame
    assert "expired" in frame["error"]["message"]
    assert await closed_with(ws) == 4401


@pytest.mark.parametrize("column", ["revoked_at", "expires_at"])
async def test_a_frame_after_a_change_no_event_announced_is_refused(server, column):
    """Revoked or expired in the database behind the server's back (as another process whose event was lost
    would leave it): once the key cache's TTL (2 s) has passed, the next request frame is refused with its id,
    as REST refuses the request, and the socket is closed."""
    _slug, key = fresh_key(server)
    ws = await authed(server, key, "pro")
    await ws.send(request_frame("before"))
    await served(ws, "before")
    past = "2000-01-01 00:00:00"
    sql(server, f"UPDATE tenants_apikey SET {column} = ? WHERE prefix = ?", past, key.rsplit("-", 1)[0])
    await asyncio.sleep(3 * 2.0)  # three TTLs: generous
    await ws.send(request_frame("after"))
    frame = await recv(ws)
    assert frame["type"] == "error" and frame["id"] == "after" and frame["error"]["code"] == "invalid_api_key", frame
    assert ("revoked" if column == "revoked_at" else "expired") in frame["error"]["message"]
    assert await closed_with(ws) == 4401


async def test_a_ceiling_set_on_the_key_while_its_socket_is_open_applies_to_the_next_frames(server):
    """`limits_set --key K --max-concurrent 1` from a shell (another process: no event reaches the server,
    the key cache's TTL bounds it): then two request frames at once, and the second is refused as REST
    refuses it (429), where the socket's first context had no ceiling."""
    slug, key = fresh_key(server)
    ws = await authed(server, key, "pro")
    await asyncio.to_thread(manage, server.env, "limits_set", "--tenant", slug, "--key", key.rsplit("-", 1)[0],
                            "--max-concurrent", "1")
    await asyncio.sleep(3 * 2.0)  # three TTLs of the key cache
    await ws.send(request_frame("one", max_tokens=48, content="Count to fifty.", ignore_eos=True))
    await ws.send(request_frame("two", max_tokens=48, content="Count to fifty.", ignore_eos=True))
    refused, done = None, None
    while done is None or refused is None:
        frame = await recv(ws)
        if frame["type"] == "error":
            refused = frame
        elif frame["type"] == "done":
            done = frame
    assert refused["id"] == "two" and refused["error"]["code"] == "rate_limit_exceeded", refused
    assert "API key" in refused["error"]["message"] and done["id"] == "one"
    await ws.close()


# ---------------------------------------------------------------- finding 3: a limited key's child is limited
def _burst(server, key: str, n: int = 4) -> list[int]:
    async def one(client):
        response = await client.post("/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, json={
            "model": MODEL, "messages": [{"role": "user", "content": "Count to twenty."}], "max_tokens": 24,
            "ignore_eos": True})
        return response.status_code

    async def all_at_once():
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            return sorted(await asyncio.gather(*(one(client) for _ in range(n))))

    return asyncio.run(all_at_once())


def test_a_key_made_by_a_limited_key_is_limited_too(server):
    """`limits_set --key K --rpm 1 --max-concurrent 1`, then K creates two keys: a burst of 4 on K gets
    [200, 429, 429, 429], and the children share K's ceilings rather than having as much again (a child got
    [200, 200, 200, 200] before; with copied ceilings alone each child's burst would get a 200 of its own)."""
    slug, key = fresh_key(server)
    manage(server.env, "limits_set", "--tenant", slug, "--key", key.rsplit("-", 1)[0], "--rpm", "1",
           "--max-concurrent", "1")
    children = []
    for name in ("child-1", "child-2"):
        made = rest(server, "POST", "/v1/keys", key, json={"name": name})
        assert made.status_code == 201
        children.append(made.json()["key"])
    started = time.monotonic()
    assert _burst(server, key) == [200, 429, 429, 429]
    bursts = _burst(server, children[0]) + _burst(server, children[1])
    # K's bucket (1 a minute, taken) refills a request every 60 s: the children find it as K left it, and on
    # a slow machine get at most what refilled meanwhile (own ceilings would give each burst a 200)
    refilled = int((time.monotonic() - started) // 60)
    assert set(bursts) <= {200, 429} and bursts.count(200) <= refilled, (bursts, refilled)


# ---------------------------------------------------------------- finding 6: frames limited like REST bodies
async def test_an_oversize_frame_is_refused_before_parsing_and_the_socket_stays_open(server):
    from inference.api.parsing import MAX_BODY_BYTES  # REST's body limit

    limit = MAX_BODY_BYTES + 1024  # and room for the frame's envelope (inference.consumers.MAX_FRAME_BYTES)
    _slug, key = fresh_key(server)
    ws = await connect(ws_url(server), additional_headers={"Authorization": f"Bearer {key}"}, max_size=None)
    await recv(ws)
    padding = "x" * (limit + 1)
    started = time.monotonic()
    await ws.send(request_frame("huge", content=padding))
    frame = await recv(ws)
    elapsed = time.monotonic() - started
    assert frame["type"] == "error" and frame["error"]["code"] == "request_too_large", frame
    assert "id" not in frame  # not parsed: its id is unknown
    await ws.send(request_frame("multibyte", content="é" * (limit // 2)))  # fewer characters than bytes
    assert (await recv(ws))["error"]["code"] == "request_too_large"
    await ws.send(json.dumps({"type": "ping"}))
    assert await recv(ws) == {"type": "pong"}
    print(f"oversize frame refused in {elapsed * 1000:.0f} ms")
    await ws.close()


async def test_a_deeply_nested_frame_is_a_400_not_a_crash(server):
    _slug, key = fresh_key(server)
    ws = await authed(server, key, "pro")
    for depth in (200, 50_000):
        nested = "[" * depth + "]" * depth
        await ws.send('{"type": "request", "id": "deep", "endpoint": "completions", "body": {"prompt": ' + nested + "}}")
        frame = await recv(ws)
        assert frame["type"] == "error" and frame["error"]["code"] == "invalid_json", frame
    await ws.send(request_frame("fine"))
    assert (await served(ws, "fine"))[0]["usage"]["completion_tokens"] > 0
    await ws.close()


async def test_refused_frames_count_against_the_keys_requests_per_minute(server):
    """An oversize frame, a frame that is not JSON and a request whose body is refused each use one of the key's
    requests per minute, as a refused REST body does: the next good request is over the limit."""
    from inference.api.parsing import MAX_BODY_BYTES

    slug, key = fresh_key(server)
    manage(server.env, "limits_set", "--tenant", slug, "--key", key.rsplit("-", 1)[0], "--rpm", "3")
    ws = await connect(ws_url(server), additional_headers={"Authorization": f"Bearer {key}"}, max_size=None)
    await recv(ws)
    await ws.send(request_frame("huge", content="x" * (MAX_BODY_BYTES + 2048)))
    assert (await recv(ws))["error"]["code"] == "request_too_large"
    await ws.send("{not json")
    assert (await recv(ws))["error"]["code"] == "invalid_json"
    await ws.send(request_frame("hot", temperature=5))
    refused = await recv(ws)
    assert refused["id"] == "hot" and refused["error"]["param"] == "temperature", refused
    await ws.send(request_frame("good"))
    limited = await recv(ws)
    assert limited["type"] == "error" and limited["id"] == "good", limited
    assert limited["error"]["type"] == "rate_limit_error", limited
    await ws.close()
