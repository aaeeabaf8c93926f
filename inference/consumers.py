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
  {"type": "done", "id", "finish_reason": "stop" | "length" | "tool_calls" | "abort", "usage": <usage> | null}
  {"type": "error", "id"?: ..., "error": {"message", "type", "param", "code"}}
  {"type": "pong"}

A bad frame (not JSON, unknown type, invalid body, unknown id, a text frame
over MAX_FRAME_BYTES: `request_too_large`, refused before it is parsed, as REST
refuses a body over its limit; JSON nested deeper than REST allows) gets an
error frame and the socket stays open. A bad key closes it with code 4401 after
the error frame, as does sending nothing but junk for AUTH_TIMEOUT_S before
authenticating. Closing the socket cancels every request still running (each
is billed for what it generated).

Authorization, per frame. A socket authenticates once, but every frame it
sends afterwards re-checks the key first, through the path REST requests take
(`aapi_key_verify`: the HMAC, revocation, expiry, the tenant's suspension,
with the ~2 s row cache), and the `inference` scope; a request frame is then
prepared and admitted with that fresh context, so the tier's limits and the
key's ceilings as they are now apply, and it is billed at the tier it has now.
The socket also watches its key, tenant and tier (tenants.services.key_events):
a revocation, suspension, scope or tier change (this web process: at once;
the others: over Redis pub/sub, within a second) and the key's expiry make it
re-check without waiting for a frame. A key no longer allowed gets an error
frame with the REST code (401 `invalid_api_key`; 403 `tenant_suspended` or
`missing_scope`) and the socket is closed, with 4401 after a 401 and 4403
after a 403. A key that cannot be checked (database unreachable) gets a 503
error frame (`auth_unavailable`); the frame is not served and the socket stays
open, except when it was authenticating: then it is closed with 1011.

The server reads a whole frame before this consumer sees it, up to its own
limit (uvicorn's `--ws-max-size`, 16 MiB by default; bigger frames close the
socket with 1009): the check here holds whatever that limit is, and setting it
near MAX_FRAME_BYTES spares the server reading what will be refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from channels.generic.websocket import AsyncJsonWebsocketConsumer

from common.errors import (
    ApiError, AuthenticationError, InvalidRequest, PermissionDenied, RateLimited, ServiceUnavailable, count_error,
    error_body,
)
from inference.api.capacity import capacity_ready, capacity_wait
from inference.api.job_run import JobRun, job_chunks
from inference.api.parsing import json_object_parse
from inference.api.responses import response_builder, usage_body
from inference.api.schemas import ENDPOINTS, api_request_parse
from inference.api.services import (
    INFERENCE_SCOPE, PreparedRequest, ajob_submit, arequest_prepare, arequest_refused_count, request_id_new,
)
from inference.metrics.gateway import refusal_count
from inference.realtime_frames import MAX_CLIENT_ID, MAX_FRAME_BYTES, frame_too_large, header_value, valid_client_id
from tenants.services.api_keys import AuthContext, aapi_key_verify, bearer_token
from tenants.services.key_events import KeyWatch, key_watch_start, key_watch_stop, key_watch_update

logger = logging.getLogger(__name__)

AUTH_TIMEOUT_S = 10.0
CANCEL_GRACE_S = 5.0  # wait this long for the engine's "abort" done event after a cancel
MAX_IN_FLIGHT = 64
CLOSE_UNAUTHORIZED = 4401  # after a 401 error frame (bad, revoked or expired key; no key in time)
CLOSE_FORBIDDEN = 4403  # after a 403 error frame (tenant suspended, no `inference` scope)
CLOSE_INTERNAL = 1011  # the key could not be checked when the socket opened


class _InFlight:
    __slots__ = ("task", "run", "cancel_requested")

    def __init__(self) -> None:
        self.task: asyncio.Task | None = None
        self.run = None
        self.cancel_requested = False


class RealtimeConsumer(AsyncJsonWebsocketConsumer):
    # frame type -> handler; tests/security checks every type has its isolation cases
    FRAME_HANDLERS = {"auth": "_on_auth", "request": "_on_request", "cancel": "_on_cancel", "ping": "_on_ping"}

    async def connect(self) -> None:
        self.auth: AuthContext | None = None
        self.in_flight: dict[str, _InFlight] = {}
        self._auth_timer: asyncio.Task | None = None
        self._key: str | None = None  # the socket's key, re-verified on every frame (kept in memory only)
        self._watch: KeyWatch | None = None
        self._recheck: asyncio.Task | None = None
        self._recheck_again = False
        self._closing = False
        # request frames are admitted in the order they arrived (asyncio.Lock wakes its waiters first in, first
        # out): of two frames sent at once under a ceiling of one, the second is the one refused, as with REST
        # requests sent one after the other; the streams themselves then run side by side
        self._admission = asyncio.Lock()
        await self.accept()
        header = header_value(self.scope, b"authorization")
        if header is not None:
            await self._authenticate(header)
        else:
            self._auth_timer = asyncio.ensure_future(self._auth_deadline())

    async def disconnect(self, code) -> None:
        self._closing = True
        self._watch_stop()
        for task in (self._auth_timer, self._recheck):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        tasks = self._cancel_all()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    def _cancel_all(self) -> list[asyncio.Task]:
        tasks = [entry.task for entry in self.in_flight.values() if entry.task is not None]
        for task in tasks:
            task.cancel()  # leaving JobRun's context cancels the job in the queue/engine
        return tasks

    # ------------------------------------------------------------ frames in
    async def receive(self, text_data=None, bytes_data=None, **kwargs) -> None:
        if self._closing:
            return  # refused and closing: nothing more is read
        if text_data is None:
            await self._error(InvalidRequest("Binary frames are not supported; send JSON text frames.", code="invalid_frame"))
            return
        if frame_too_large(text_data):  # before any parsing
            error = InvalidRequest(
                f"The frame is too large (limit {MAX_FRAME_BYTES} bytes).", code="request_too_large", status=413)
            await self._refusal_count(error)
            await self._error(error)
            return
        try:
            frame = json_object_parse(raw=text_data)
        except ApiError as exc:
            await self._refusal_count(exc)
            await self._error(exc)
            return
        await self.receive_json(frame)

    async def receive_json(self, content, **kwargs) -> None:
        kind = content.get("type")
        handler = self.FRAME_HANDLERS.get(kind) if isinstance(kind, str) else None
        if handler is None:
            await self._error(InvalidRequest(
                f"Unknown frame type {str(kind)[:40]!r}; expected auth, request, cancel or ping.", param="type", code="invalid_frame"
            ))
            return
        if self.auth is not None:  # every frame of an authenticated socket re-checks its key first
            client_id = content.get("id") if kind == "request" and valid_client_id(content.get("id")) else None
            if not await self._reauthorize(client_id):
                return
        await getattr(self, handler)(content)

    async def _on_ping(self, content: dict) -> None:
        await self._send({"type": "pong"})

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
        if not valid_client_id(client_id):
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
        entry.task = asyncio.ensure_future(self._run(client_id, entry, endpoint, dict(body, stream=True), self.auth))

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
    async def _run(self, client_id: str, entry: _InFlight, endpoint: str, body: dict, auth: AuthContext) -> None:
        """One request, with the context its frame was authorized with (the tier and ceilings of now)."""
        try:
            prepared, run = await self._admitted(endpoint, body, auth)
            builder = response_builder(prepared=prepared)
            builder.include_usage = False  # usage comes in the done frame
            entry.run = run
            if entry.cancel_requested:
                run.cancel()
            async with contextlib.aclosing(job_chunks(run, builder)) as chunks:  # closed (job cancelled) on any exit
                async for chunk in chunks:
                    await self._send({"type": "chunk", "id": client_id, "data": chunk})
            done = run.done
            await self._send({"type": "done", "id": client_id, "finish_reason": builder.finish_reason or done.finish_reason,
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

    async def _admitted(self, endpoint: str, body: dict, auth: AuthContext) -> tuple[PreparedRequest, JobRun]:
        """Parse, prepare, admit and queue a frame in arrival order (`self._admission`); one whose model has no
        worker yet waits for one (capacity_wait) out of that line, then queues again: it holds up no later frame."""
        request_id = request_id_new()
        async with self._admission:
            try:
                request = api_request_parse(endpoint=endpoint, body=body)
                prepared = await arequest_prepare(auth=auth, request=request, request_id=request_id)
            except ApiError as exc:  # refused for its body: it still counts against the key's requests per minute
                await arequest_refused_count(auth=auth, request_id=request_id, error=exc)
                raise
            if await _counted(capacity_ready(prepared.model.name), prepared):
                return prepared, await ajob_submit(prepared=prepared)  # its capacity check: the yes just read
        await _counted(capacity_wait(prepared.model.name), prepared)
        async with self._admission:
            return prepared, await ajob_submit(prepared=prepared)

    async def _refusal_count(self, error: ApiError) -> None:
        """A frame refused unparsed (too large, not JSON) on an authenticated socket counts against the key's
        requests per minute, as a REST body refused so does: a client cannot send them for free."""
        if self.auth is not None:
            await arequest_refused_count(auth=self.auth, request_id=request_id_new(), error=error)

    # ------------------------------------------------------------ the key
    async def _authenticate(self, authorization: str) -> None:
        try:
            key = bearer_token(authorization=authorization)
            context = await _verified(key)
        except ApiError as exc:
            await self._refuse(exc)
            return
        except Exception:
            logger.warning("websocket: the key could not be checked", exc_info=True)
            await self._error(_unavailable())
            self._closing = True
            await self._close(CLOSE_INTERNAL)
            return
        if self._closing:  # the client left meanwhile: nothing to watch
            return
        if self._auth_timer is not None:
            self._auth_timer.cancel()
        self._key, self.auth = key, context
        self._watch = key_watch_start(context=context, on_change=self._key_changed)
        await self._send({"type": "authenticated", "tenant": context.tenant.slug, "tier": context.tier.name})

    async def _reauthorize(self, client_id: str | None = None, *, quiet: bool = False) -> bool:
        """Re-check the socket's key (a frame came, or the key, tenant or tier changed); False when the
        frame must not be served: the key is refused (the socket closes) or could not be checked."""
        if self._closing:
            return False
        try:
            context = await _verified(self._key)
        except ApiError as exc:
            await self._refuse(exc, client_id)
            return False
        except Exception:
            logger.warning("websocket: the key could not be re-checked", exc_info=True)
            if not quiet:
                await self._error(_unavailable(), client_id)
            return False
        if self._closing:
            return False
        self.auth = context
        if self._watch is not None:
            key_watch_update(self._watch, context=context)
        return True

    def _key_changed(self) -> None:
        """From the watch, on this loop: re-check now (once more after, if another change comes meanwhile)."""
        if self._closing or self._key is None:
            return
        if self._recheck is not None and not self._recheck.done():
            self._recheck_again = True
            return
        self._recheck = asyncio.ensure_future(self._rechecking())

    async def _rechecking(self) -> None:
        while not self._closing:
            self._recheck_again = False
            await self._reauthorize(quiet=True)
            if not self._recheck_again:
                return

    async def _refuse(self, exc: ApiError, client_id: str | None = None) -> None:
        """The key is not (or no longer) allowed: say why, cancel what runs, close (4401 / 4403)."""
        if self._closing:
            return
        self._closing = True
        await self._error(exc, client_id)
        self._watch_stop()
        self._cancel_all()
        await self._close(CLOSE_FORBIDDEN if exc.status_code == 403 else CLOSE_UNAUTHORIZED)

    async def _close(self, code: int) -> None:
        try:
            await self.close(code=code)
        except Exception:  # the socket is gone already; disconnect() cancels the rest
            logger.debug("close of a closed websocket dropped", exc_info=True)

    def _watch_stop(self) -> None:
        if self._watch is not None:
            key_watch_stop(self._watch)
            self._watch = None

    # ------------------------------------------------------------ helpers
    async def _auth_deadline(self) -> None:
        await asyncio.sleep(AUTH_TIMEOUT_S)
        if self.auth is None:
            await self._refuse(AuthenticationError(f"No API key within {AUTH_TIMEOUT_S:g} s of connecting."))

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


async def _verified(key: str) -> AuthContext:
    """The key's context as REST would find it now, and the scope every frame of this socket needs."""
    context = await aapi_key_verify(key=key)
    if not context.api_key.has_scope(INFERENCE_SCOPE):  # the same refusal as the completion endpoints'
        raise PermissionDenied("This API key does not have the 'inference' scope.", code="missing_scope")
    return context


def _unavailable() -> ServiceUnavailable:
    return ServiceUnavailable("The API key cannot be checked right now. Please retry shortly.",
                              code="auth_unavailable")


async def _counted(step, prepared: PreparedRequest):
    try:  # a capacity step taken here, not in ajob_submit: its refusal counted as ajob_submit counts one
        return await step
    except ApiError as exc:
        refusal_count(model=prepared.model.name, tier=prepared.auth.tier.name, code=exc.code)
        raise


def _cancel_if_running(task: asyncio.Task | None) -> None:
    if task is not None and not task.done():
        task.cancel()
