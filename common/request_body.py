"""A deadline on reading an HTTP request body: 408 and the connection closed, not held open.

Neither uvicorn nor Django bounds the time a request body may take: a client
that sends its headers and then drips the body, or stops short of its
Content-Length and waits, keeps a connection (and a request slot) open for as
long as it likes. `body_deadline(app)` wraps an ASGI app: the body's
`http.request` messages must all have arrived `timeout_s` after the request
began (settings.REQUEST_BODY_TIMEOUT_S). When they have not, the app is told
the client left (`http.disconnect`: Django then drops the request without
running a view), and the client gets a 408 in the OpenAI error shape with
`Connection: close`, on which uvicorn closes the connection.
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
