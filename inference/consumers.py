"""WebSocket `/v1/realtime`: several streamed completions over one socket.

Not OpenAI's audio Realtime API: a small JSON protocol carrying the same
request bodies and `chat.completion.chunk` / `text_completion` objects as REST.

Client -> server
  {"type": "auth", "api_key": "sk-..."}           unless `Authorization: Bearer` was on the handshake
  {"type": "request", "id": "<client id>", "endpoint": "chat.completions" | "completions",
   "body": {...same as REST; always streamed...}}
  {"type": "cancel", "id": "<client id>"}
  {"type": "ping"}
Server -> client
  {"type": "authenticated", "tenant": slug, "tier": name}
  {"type": "chunk", "id", "data": <chunk object>}
  {"type": "done", "id", "finish_reason": "stop" | "length" | "abort", "usage": <OpenAI usage> | null}
  {"type": "error", "id"?: ..., "error": {"message", "type", "param", "code"}}
  {"type": "pong"}

A bad frame (not JSON, unknown type, invalid body, unknown id) gets an error
frame and the socket stays open. A bad key closes it with code 4401 after the
error frame, as does sending nothing but junk for AUTH_TIMEOUT_S before
authenticating. Closing the socket cancels every request still running.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from channels.generic.websocket import AsyncJsonWebsocketConsumer

from common.errors import ApiError, AuthenticationError, InvalidRequest, RateLimited, count_error, error_body
from inference.api.events import job_chunks
from inference.api.parsing import json_object_parse
from inference.api.responses import response_builder, usage_body
from inference.api.schemas import ENDPOINTS, api_request_parse
from inference.api.services import ajob_submit, arequest_prepare
from tenants.services.api_keys import aapi_key_authenticate

logger = logging.getLogger(__name__)

AUTH_TIMEOUT_S = 10.0
CANCEL_GRACE_S = 5.0  # wait this long for the engine's "abort" done event after a cancel
MAX_IN_FLIGHT = 64
MAX_CLIENT_ID = 128
CLOSE_UNAUTHORIZED = 4401


class _InFlight:
    __slots__ = ("task", "run", "cancel_requested")

    def __init__(self) -> None:
        self.task: asyncio.Task | None = None
        self.run = None
        self.cancel_requested = False


class RealtimeConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self) -> None:
        self.auth = None
        self.in_flight: dict[str, _InFlight] = {}
        self._auth_timer: asyncio.Task | None = None
        await self.accept()
        header = _header(self.scope, b"authorization")
        if header is not None:
            await self._authenticate(header)
        else:
            self._auth_timer = asyncio.ensure_future(self._auth_deadline())

    async def disconnect(self, code) -> None:
        if self._auth_timer is not None:
            self._auth_timer.cancel()
        tasks = [entry.task for entry in self.in_flight.values() if entry.task is not None]
        for task in tasks:
            task.cancel()  # leaving JobRun's context cancels the job in the queue/engine
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    # ------------------------------------------------------------ frames in
    async def receive(self, text_data=None, bytes_data=None, **kwargs) -> None:
        if text_data is None:
            await self._error(InvalidRequest("Binary frames are not supported; send JSON text frames.", code="invalid_frame"))
            return
        try:
            frame = json_object_parse(raw=text_data)
        except ApiError as exc:
            await self._error(exc)
            return
        await self.receive_json(frame)

    async def receive_json(self, content, **kwargs) -> None:
        kind = content.get("type")
        if kind == "ping":
            await self._send({"type": "pong"})
        elif kind == "auth":
            await self._on_auth(content)
        elif kind == "request":
            await self._on_request(content)
        elif kind == "cancel":
            await self._on_cancel(content)
        else:
            await self._error(InvalidRequest(
                f"Unknown frame type {str(kind)[:40]!r}; expected auth, request, cancel or ping.", param="type", code="invalid_frame"
            ))

    async def _on_auth(self, content: dict) -> None:
        if self.auth is not None:
            await self._error(InvalidRequest("This socket is already authenticated.", param="type", code="already_authenticated"))
            return
        key = content.get("api_key")
        if not isinstance(key, str) or not key:
            await self._error(InvalidRequest("The auth frame needs a string 'api_key'.", param="api_key"))
            return
        await self._authenticate(f"Bearer {key}")

    async def _on_request(self, content: dict) -> None:
        client_id = content.get("id")
        if not isinstance(client_id, str) or not client_id or len(client_id) > MAX_CLIENT_ID or not client_id.isprintable():
            await self._error(InvalidRequest(f"A request frame needs a string 'id' of 1 to {MAX_CLIENT_ID} printable characters.", param="id"))
            return
        if self.auth is None:
            await self._error(AuthenticationError("Authenticate first: send {\"type\": \"auth\", \"api_key\": ...}."), client_id)
            return
        if client_id in self.in_flight:
            await self._error(InvalidRequest(f"A request with id {client_id!r} is already running on this socket.", param="id"), client_id)
            return
        if len(self.in_flight) >= MAX_IN_FLIGHT:
            await self._error(RateLimited(f"At most {MAX_IN_FLIGHT} requests may run at once on one socket."), client_id)
            return
        endpoint, body = content.get("endpoint"), content.get("body")
        if endpoint not in ENDPOINTS:
            await self._error(InvalidRequest("'endpoint' must be 'chat.completions' or 'completions'.", param="endpoint"), client_id)
            return
        if not isinstance(body, dict):
            await self._error(InvalidRequest("'body' must be a JSON object (the REST request body).", param="body"), client_id)
            return
        entry = _InFlight()
        self.in_flight[client_id] = entry
        entry.task = asyncio.ensure_future(self._run(client_id, entry, endpoint, dict(body, stream=True)))

    async def _on_cancel(self, content: dict) -> None:
        client_id = content.get("id")
        entry = self.in_flight.get(client_id) if isinstance(client_id, str) else None
        if entry is None:
            await self._error(InvalidRequest(f"No running request has id {str(client_id)[:MAX_CLIENT_ID]!r}.", param="id", code="unknown_request"))
            return
        entry.cancel_requested = True
        if entry.run is not None:
            entry.run.cancel()  # the engine's done event ("abort") ends the task with real usage
            asyncio.get_running_loop().call_later(CANCEL_GRACE_S, _cancel_if_running, entry.task)
        elif entry.task is not None:
            entry.task.cancel()  # not queued yet: nothing to abort

    # ------------------------------------------------------------ one request
    async def _run(self, client_id: str, entry: _InFlight, endpoint: str, body: dict) -> None:
        try:
            request = api_request_parse(endpoint=endpoint, body=body)
            prepared = await arequest_prepare(auth=self.auth, request=request)
            builder = response_builder(prepared=prepared)
            builder.include_usage = False  # usage comes in the done frame
            run = await ajob_submit(prepared=prepared)
            entry.run = run
            if entry.cancel_requested:
                run.cancel()
            async with contextlib.aclosing(job_chunks(run, builder)) as chunks:  # closed (job cancelled) on any exit
                async for chunk in chunks:
                    await self._send({"type": "chunk", "id": client_id, "data": chunk})
            done = run.done
            await self._send({"type": "done", "id": client_id, "finish_reason": done.finish_reason,
                              "usage": usage_body(done.usage)})
        except asyncio.CancelledError:
            if entry.cancel_requested:  # cancelled by the client (no engine answer in time)
                with contextlib.suppress(Exception):
                    await self._send({"type": "done", "id": client_id, "finish_reason": "abort", "usage": None})
            raise
        except ApiError as exc:
            await self._error(exc, client_id)
        except Exception:
            logger.exception("websocket request %s failed", client_id)
            body = error_body("The server had an error while processing your request.", error_type="server_error")
            count_error(500, body)
            await self._send({"type": "error", "id": client_id, "error": body["error"]})
        finally:
            if self.in_flight.get(client_id) is entry:
                del self.in_flight[client_id]

    # ------------------------------------------------------------ helpers
    async def _authenticate(self, authorization: str) -> None:
        try:
            self.auth = await aapi_key_authenticate(authorization=authorization)
        except ApiError as exc:
            await self._error(exc)
            await self.close(code=CLOSE_UNAUTHORIZED)
            return
        if self._auth_timer is not None:
            self._auth_timer.cancel()
        await self._send({"type": "authenticated", "tenant": self.auth.tenant.slug, "tier": self.auth.tier.name})

    async def _auth_deadline(self) -> None:
        await asyncio.sleep(AUTH_TIMEOUT_S)
        if self.auth is None:
            await self._error(AuthenticationError(f"No API key within {AUTH_TIMEOUT_S:g} s of connecting."))
            await self.close(code=CLOSE_UNAUTHORIZED)

    async def _error(self, exc: ApiError, client_id: str | None = None) -> None:
        body = exc.body()
        count_error(exc.status_code, body)  # the console's errors by code, as for an HTTP error response
        frame = {"type": "error", "error": body["error"]}
        if client_id is not None:
            frame["id"] = client_id
        await self._send(frame)

    async def _send(self, frame: dict) -> None:
        try:
            await self.send_json(frame)
        except Exception:  # the socket is gone; disconnect() cancels the rest
            logger.debug("send on a closed websocket dropped", exc_info=True)


def _cancel_if_running(task: asyncio.Task | None) -> None:
    if task is not None and not task.done():
        task.cancel()


def _header(scope: dict, name: bytes) -> str | None:
    for key, value in scope.get("headers") or []:
        if key.lower() == name:
            return value.decode("latin-1")
    return None
