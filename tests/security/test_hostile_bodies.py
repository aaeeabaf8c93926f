"""Hostile paths and bodies against a real uvicorn process (DEBUG, as `make run`): 4xx, never 500, and never free.

- `GET /static/../.env` and its spellings, sent on a raw socket as written
  (curl --path-as-is): 404 from DEBUG's static handler, no file read outside
  the static directories (common.static_files). Before: a 500.
- `/v1/invoices/²`, `/v1/keys/²`, an id past 2**63: 404 in the OpenAI shape.
- 50,000 nested arrays to `POST /v1/keys` (DRF's parser) and to the
  completions: 400 `invalid_json` (common.json_body). Before: a 500 on /v1/keys.
- A Content-Length over the 2.5 MiB limit is refused from the header (413, the
  connection closed) without waiting for the body; the completion endpoints
  count it, and bodies that fail to parse, against the key's requests per
  minute (common.request_body, inference.api.services). Before: the server
  waited for the body (here its 1 s deadline: a 408), and nothing was counted.
"""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from tests.e2e.processes import MODEL, manage
from tests.security.hostile_server import hostile_server_shared

pytestmark = [pytest.mark.slow]

LIMIT = 2_621_440


@pytest.fixture(scope="module")
def server(tmp_path_factory, pytestconfig):
    return hostile_server_shared(tmp_path_factory, pytestconfig)


def _raw(server, request: bytes, *, timeout: float = 10) -> tuple[int, bytes, str]:
    """Send `request` as written; (status, body, lower-cased head) of the answer."""
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.settimeout(timeout)
        sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), None)
        while length is not None and len(body) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
    return int(head.split(b" ", 2)[1]), body, head.decode("latin-1").lower()


@pytest.mark.parametrize("path", ["/static/../.env", "/static/../../../../etc/passwd", "/static/%2e%2e/manage.py",
                                  "/static/admin/../../../../../etc/hostname", "/static/..%2fmanage.py"])
def test_a_static_path_out_of_the_static_dirs_is_404(server, path):
    status, body, _ = _raw(server, f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    assert status == 404, (path, status)
    assert b"root:" not in body and b"DJANGO_SETTINGS_MODULE" not in body and b"SECRET_KEY=" not in body
    assert _raw(server, b"GET /static/admin/css/base.css HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")[0] == 200


@pytest.mark.parametrize("path", ["/v1/invoices/%C2%B2", "/v1/keys/%C2%B2", "/v1/keys/99999999999999999999999",
                                  "/v1/keys/%C2%B2/revoke"])
def test_a_hostile_id_is_an_openai_shaped_404(server, path):
    response = httpx.get(server.url + path, headers={"Authorization": f"Bearer {server.keys['pro']}"}, timeout=30)
    assert response.status_code == 404
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("path", ["/v1/keys", "/v1/chat/completions", "/v1/completions"])
def test_deeply_nested_json_is_a_400(server, path):
    body = b"[" * 50_000 + b"]" * 50_000
    response = httpx.post(server.url + path, content=body, timeout=30, headers={
        "Authorization": f"Bearer {server.keys['pro']}", "Content-Type": "application/json"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_json" and "levels deep" in error["message"]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/keys"])
def test_an_oversize_content_length_is_refused_before_the_body_is_sent(server, path):
    """The head alone: the 413 comes at once (the body deadline, 1 s here, would answer 408 had it waited)."""
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {server.keys['pro']}\r\nContent-Length: {3 * 1024 * 1024}\r\n\r\n").encode()
    started = time.monotonic()
    status, body, head_text = _raw(server, head)
    assert status == 413 and time.monotonic() - started < 0.9
    assert "connection: close" in head_text
    assert json.loads(body)["error"]["code"] == "request_too_large"


def _key_with_rpm(server, rpm: int, name: str) -> str:
    manage(server.env, "create_tenant", "--slug", name, "--tier", "pro")
    key = json.loads(manage(server.env, "create_api_key", "--tenant", name, "--name", "rpm", "--json"))["key"]
    manage(server.env, "limits_set", "--tenant", name, "--key", "sk-" + key.split("-")[1], "--rpm", str(rpm))
    return key


def _chat(server, key: str, *, content: bytes | None = None, chunked: bool = False) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    if content is None:
        content = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
                              "max_tokens": 1}).encode()
    if chunked:
        content = iter([content[i:i + 65536] for i in range(0, len(content), 65536)])
    return httpx.post(server.url + "/v1/chat/completions", content=content, headers=headers, timeout=60)


def test_oversize_and_malformed_bodies_count_against_the_keys_rpm(server):
    key = _key_with_rpm(server, 4, "h-rpm-bodies")
    big = b'{"model": "' + MODEL.encode() + b'", "messages": [{"role": "user", "content": "' + b"a" * (LIMIT + 10)
    refused = [_chat(server, key, content=big + b'"}]}'), _chat(server, key, content=big, chunked=True),
               _chat(server, key, content=b'{"model": '), _chat(server, key, content=b"[" * 5000)]
    assert [r.status_code for r in refused] == [413, 413, 400, 400]
    assert [r.headers.get("x-ratelimit-remaining-requests") for r in refused] == ["3", "2", "1", "0"]
    limited = _chat(server, key)  # a good request now finds the minute's requests used up
    assert limited.status_code == 429 and limited.json()["error"]["code"] == "rate_limit_exceeded"
