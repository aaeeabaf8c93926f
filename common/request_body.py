"""Request bodies at the ASGI edge: a deadline on reading them (408), and a size limit checked before reading (413).

The deadline. Neither uvicorn nor Django bounds the time a request body may take: a client
that sends its headers and then drips the body, or stops short of its
Content-Length and waits, keeps a connection (and a request slot) open for as
long as it likes. `body_deadline(app)` wraps an ASGI app: the body's
`http.request` messages must all have arrived `timeout_s` after the request
began (settings.REQUEST_BODY_TIMEOUT_S). When they have not, the app is told
the client left (`http.disconnect`: Django then drops the request without
running a view), and the client gets a 408 in the OpenAI error shape with
`Connection: close`, on which uvicorn closes the connection.

The size limit: `body_limit(app)` refuses a body over DATA_UPLOAD_MAX_MEMORY_SIZE
from its Content-Length, before reading it (see its docstring).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from common.errors import error_body

logger = logging.getLogger(__name__)


def _timeout_response_body(timeout_s: float) -> bytes:
    message = f"The request body was not received within {timeout_s:g} seconds."
    return json.dumps(error_body(message, error_type="invalid_request_error", code="request_timeout")).encode()


def body_deadline(app, *, timeout_s=None):
    """Wrap the ASGI `app` (HTTP scopes only) with the body deadline; `timeout_s` (a number or a callable
    returning one) defaults to settings.REQUEST_BODY_TIMEOUT_S, read per request."""

    def limit() -> float:
        if timeout_s is None:
            from django.conf import settings

            return float(settings.REQUEST_BODY_TIMEOUT_S)
        return float(timeout_s() if callable(timeout_s) else timeout_s)

    async def guarded(scope, receive, send):
        if scope["type"] != "http":
            return await app(scope, receive, send)
        seconds = limit()
        deadline = time.monotonic() + seconds
        state = {"body_done": False, "timed_out": False, "started": False}

        async def receive_with_deadline():
            if state["body_done"] or state["timed_out"]:
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(deadline - time.monotonic(), 0.0))
            except TimeoutError:
                state["timed_out"] = True
                return {"type": "http.disconnect"}
            if message["type"] != "http.request" or not message.get("more_body", False):
                state["body_done"] = True
            return message

        async def tracking_send(message):
            if message["type"] == "http.response.start":
                state["started"] = True
            await send(message)

        await app(scope, receive_with_deadline, tracking_send)
        if state["timed_out"] and not state["started"]:
            logger.info("request body of %s %s not received within %g s: 408", scope.get("method"),
                        scope.get("path"), seconds)
            body = _timeout_response_body(seconds)
            await send({"type": "http.response.start", "status": 408, "headers": [
                (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ]})
            await send({"type": "http.response.body", "body": body})

    return guarded


# ---------------------------------------------------------------- size limit
REFUSED_SCOPE_KEY = "llmp.body_too_large"  # scope entry of a request whose body was refused: the byte limit


def _declared_length(scope) -> int | None:
    for name, value in scope.get("headers") or ():
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # uvicorn's parser refuses it before the app runs
    return None


def _too_large_body(limit: int) -> bytes:
    message = f"The request body is too large (limit {limit} bytes)."
    return json.dumps(error_body(message, error_type="invalid_request_error", code="request_too_large")).encode()


def body_limit(app, *, max_bytes=None, applies=None, refused_by_app=frozenset()):
    """Wrap the ASGI `app`: a body over `max_bytes` (a number or a callable returning one; default
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE, read per request) is refused with 413 in the OpenAI error shape
    without being read, for the paths `applies(path)` accepts (default: those under /v1).

    Django reads a whole body into memory or a temporary file before it looks at its size, so a 12 MiB
    body used to cost the reading and the spooling of 12 MiB before its 413. Here a Content-Length over the
    limit is refused from the header alone; a body without one (chunked) is read up to the limit and refused
    at the first byte past it. The paths in `refused_by_app` (the completion endpoints, which count a refused
    body against the key's requests per minute) still reach the app, with an empty body and
    `scope[REFUSED_SCOPE_KEY]` set to the limit: the view answers the 413 once it has checked the key. The
    413 closes the connection (`Connection: close`), so the rest of the body is never read: letting uvicorn
    read and drop it instead would keep the connection but cost reading it (benchmarks/oversize_body.py:
    6 ms of CPU per 3 MiB against 2 ms closed; httpx, curl and the openai SDKs read the 413 either way).
    """

    def limit() -> int:
        if max_bytes is None:
            from django.conf import settings

            return int(settings.DATA_UPLOAD_MAX_MEMORY_SIZE)
        return int(max_bytes() if callable(max_bytes) else max_bytes)

    def limited(path: str) -> bool:
        if applies is None:
            return path == "/v1" or path.startswith("/v1/")
        return applies(path)

    async def guarded(scope, receive, send):
        if scope["type"] != "http" or not limited(scope.get("path", "")):
            return await app(scope, receive, send)
        most = limit()
        declared = _declared_length(scope)
        if declared is not None:
            if declared <= most:
                return await app(scope, receive, send)  # uvicorn delivers no more than Content-Length
            return await _refuse(app, refused_by_app, scope, send, most)
        # no Content-Length (chunked): read up to the limit here, then hand the app what was read
        messages, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return await app(scope, _replay([message], receive), send)  # the client left: the app sees it
            size += len(message.get("body", b""))
            if size > most:
                return await _refuse(app, refused_by_app, scope, send, most)
            messages.append(message)
            if not message.get("more_body", False):
                return await app(scope, _replay(messages, receive), send)

    return guarded


async def _refuse(app, refused_by_app, scope, send, most: int):
    """Refuse a body over `most` bytes: a 413 closing the connection, or for a path in `refused_by_app`, the
    app with an empty body and scope[REFUSED_SCOPE_KEY] set (it answers the 413 itself)."""
    logger.info("request body of %s %s over %d bytes: 413", scope.get("method"), scope.get("path"), most)
    if scope.get("path") in refused_by_app:
        return await app({**scope, REFUSED_SCOPE_KEY: most}, _empty_body(), _closing(send))
    body = _too_large_body(most)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"connection", b"close")]
    await send({"type": "http.response.start", "status": 413, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _replay(messages: list, receive):
    """A receive that gives `messages` first, then the real one's."""
    pending = list(messages)

    async def replayed():
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed


def _empty_body():
    """The receive of a refused body: one empty message, then nothing (the body is never read). Django's
    handler waits on it for a disconnect while the view runs, and cancels that wait when the view is done."""
    sent = False

    async def receive():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.Event().wait()  # never set: cancelled with the view's disconnect listener

    return receive


def _closing(send):
    async def send_closing(message):
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), (b"connection", b"close")]}
        await send(message)

    return send_closing
