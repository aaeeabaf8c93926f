"""Hostile clients against a real uvicorn process: slow and short bodies, foreign Origins, a WebSocket frame fuzzer.

- A body that does not arrive within REQUEST_BODY_TIMEOUT_S (1 s here),
  whether dripped or stopped short of its Content-Length, gets 408 in the
  OpenAI error shape and the connection is closed by the server.
- The WebSocket refuses a browser's foreign Origin at the handshake (403),
  accepts an allowed one, and accepts none at all (the SDKs send none), which
  still needs an API key.
- Frame fuzzer (Hypothesis): random bytes, random text, random JSON and
  protocol-shaped frames with random fields, sent on one authenticated
  socket; every reply is a JSON frame of the protocol (errors in the OpenAI
  shape), the socket is never closed, and afterwards it still serves a real
  completion.
"""

from __future__ import annotations

import json
import socket
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.e2e.processes import MODEL
from tests.security.hostile_server import ALLOWED_ORIGIN, hostile_server_shared

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def server(tmp_path_factory, pytestconfig):
    return hostile_server_shared(tmp_path_factory, pytestconfig)


def _head(path: str, length: int, **headers: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json", f"Content-Length: {length}",
             *(f"{name}: {value}" for name, value in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (a read timeout fails the test)."""
    sock.settimeout(30)
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk


def _read_response(sock: socket.socket) -> bytes:
    """One whole response on a connection that stays open: its head, then Content-Length bytes of body (the server
    may send them in separate segments)."""
    sock.settimeout(30)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def _status_and_body(raw: bytes) -> tuple[int, dict, str]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body), head.decode("latin-1").lower()


@pytest.mark.parametrize("path", ["/v1/keys", "/v1/chat/completions"])
def test_body_short_of_its_content_length_is_408_and_closed(server, path):
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(_head(path, 100, Authorization=f"Bearer {server.keys['pro']}") + b'{"name": "sh')
        raw = _read_until_closed(sock)  # the server closes it: recv returns b""
    status, body, head = _status_and_body(raw)
    assert status == 408 and "connection: close" in head
    assert body["error"]["code"] == "request_timeout" and set(body["error"]) == {"message", "type", "param", "code"}


def test_dripped_body_is_408_and_closed(server):
    payload = json.dumps({"name": "drip" * 20}).encode()
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(_head("/v1/keys", len(payload), Authorization=f"Bearer {server.keys['pro']}"))
        sent = 0
        try:
            for byte in payload:  # one byte every 0.2 s: the whole body would take ~20 s
                sock.sendall(bytes([byte]))
                sent += 1
                time.sleep(0.2)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server closed the connection after its 408
        raw = _read_until_closed(sock)
    assert sent < len(payload)
    status, body, head = _status_and_body(raw)
    assert status == 408 and body["error"]["code"] == "request_timeout"


def test_a_whole_body_is_served_and_the_connection_kept(server):
    payload = json.dumps({"name": "whole"}).encode()
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(_head("/v1/keys", len(payload), Authorization=f"Bearer {server.keys['pro']}") + payload)
        raw = _read_response(sock)
        status, body, head = _status_and_body(raw)
        assert status == 201 and body["object"] == "api_key" and "connection: close" not in head
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")  # the same connection serves again
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")


# ---------------------------------------------------------------- WebSocket Origin
def test_foreign_origin_is_refused_at_the_handshake(server):
    with pytest.raises(InvalidStatus) as refused:
        connect(server.ws_url, origin="https://evil.example.net",
                additional_headers={"Authorization": f"Bearer {server.keys['pro']}"}, open_timeout=30)
    assert refused.value.response.status_code == 403


@pytest.mark.parametrize("origin", [ALLOWED_ORIGIN, None])
def test_allowed_or_absent_origin_connects_with_a_key(server, origin):
    with connect(server.ws_url, origin=origin, open_timeout=30,
                 additional_headers={"Authorization": f"Bearer {server.keys['pro']}"}) as ws:
        assert json.loads(ws.recv(timeout=30))["type"] == "authenticated"


# ---------------------------------------------------------------- frame fuzzer
_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=30))
_json = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)), max_leaves=12)
_protocol_frames = st.fixed_dictionaries(
    {"type": st.sampled_from(["auth", "request", "cancel", "ping", "pong", "chunk", "", "REQUEST"])},
    optional={
        "id": st.one_of(st.text(max_size=140), _scalars),
        "api_key": st.one_of(st.text(max_size=80), _scalars),
        "endpoint": st.one_of(st.sampled_from(["chat.completions", "completions", "embeddings"]), _scalars),
        "body": st.one_of(_json, st.fixed_dictionaries({"model": st.text(max_size=20)}, optional={
            "prompt": _json, "messages": _json, "max_tokens": _scalars, "stream": _scalars})),
    },
)
FRAMES = st.one_of(
    st.binary(max_size=64).map(lambda data: ("bytes", data)),
    st.text(max_size=64).map(lambda text: ("text", text)),
    _json.map(lambda value: ("text", json.dumps(value))),
    _protocol_frames.map(lambda frame: ("text", json.dumps(frame))),
)
KNOWN_REPLIES = {"error", "pong", "chunk", "done"}


class Replies:
    """Counts the socket's answers; `sync()` reads until the server has answered a marker frame.

    Every frame the fuzzer sends gets exactly one answer: an error frame (in the
    OpenAI shape), a pong for a ping, or a done frame for a request it cancelled.
    A request's error may come after later frames (it is checked in a task), so
    answers are counted over the whole run, not frame by frame.
    """

    def __init__(self, ws) -> None:
        self.ws, self.answers, self.markers = ws, 0, 0

    def sync(self) -> None:
        self.markers += 1
        marker = f"marker-{self.markers}"
        self.ws.send(json.dumps({"type": "cancel", "id": marker}))
        while True:
            frame = json.loads(self.ws.recv(timeout=60))
            assert frame.get("type") in KNOWN_REPLIES, frame
            if frame["type"] == "error":
                assert set(frame["error"]) == {"message", "type", "param", "code"}, frame
                if f"'{marker}'" in frame["error"]["message"]:
                    return
            if frame["type"] != "chunk":
                self.answers += 1


def test_frame_fuzzer_gets_error_frames_and_the_socket_stays_usable(server):
    with connect(server.ws_url, open_timeout=30, max_size=2**22,
                 additional_headers={"Authorization": f"Bearer {server.keys['pro']}"}) as ws:
        assert json.loads(ws.recv(timeout=30))["type"] == "authenticated"
        replies, sent = Replies(ws), []

        @given(frame=FRAMES)
        @settings(max_examples=150, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        def fuzz(frame):
            kind, data = frame
            ws.send(data)  # bytes: a binary frame; str: a text frame
            sent.append(kind)
            replies.sync()

        fuzz()
        for _ in range(50):  # the last requests' errors may still be on their way
            if replies.answers >= len(sent):
                break
            replies.sync()
        assert len(sent) >= 100 and replies.answers == len(sent)
        # still usable: a real completion on the same socket
        ws.send(json.dumps({"type": "request", "id": "after-fuzz", "endpoint": "completions",
                            "body": {"model": MODEL, "prompt": "Hello", "max_tokens": 2}}))
        while True:
            frame = json.loads(ws.recv(timeout=120))
            if frame.get("id") == "after-fuzz" and frame["type"] in ("done", "error"):
                break
        assert frame["type"] == "done" and frame["usage"]["completion_tokens"] >= 1, frame
