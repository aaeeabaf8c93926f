"""`POST /v1/chat/completions` and `POST /v1/completions`: async Django views.

Async views on Django's ASGI handler rather than DRF (sync) or a Channels
`AsyncHttpConsumer`: Django 5 cancels the view task when the client
disconnects (`http.disconnect`), for whole and streamed responses alike, and
closes a streaming response's async generator; both paths leave `JobRun`'s
context, which cancels the job. Middleware, URL routing and the OpenAI error
bodies stay the same as every other view.

Streaming sends `data: {chunk}\\n\\n` events: a first chat chunk with the role,
content deltas, a chunk with `finish_reason`, a usage chunk (`choices: []`)
when `stream_options.include_usage`, then `data: [DONE]`. `: keep-alive`
comments go out every `SSE_KEEPALIVE_S` (15 s) while the engine is quiet (e.g. queued).
An error after the stream began is one `data: {"error": {...}}` event.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.exceptions import DisallowedHost, RequestDataTooBig
from django.db import close_old_connections
from django.http import HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from common.errors import ApiError, InvalidRequest, ServiceUnavailable, count_error, error_body, error_json_response
from common.outage import Outage, connection_lost
from common.request_body import REFUSED_SCOPE_KEY
from inference.api.job_run import JobRun, job_chunks, job_collect
from inference.api.parsing import json_object_parse
from inference.api.responses import ResponseBuilder, response_builder
from inference.api.schemas import CHAT, COMPLETIONS, api_request_parse
from inference.api.services import (
    PreparedRequest, ajob_submit, arequest_prepare, arequest_refused_count, request_id_new,
)
from tenants.services.api_keys import aapi_key_authenticate

logger = logging.getLogger(__name__)
_database_outage = Outage(logger, "web: database")

_MAX_CLIENT_REQUEST_ID = 512


_ENCODER = json.JSONEncoder(separators=(",", ":"))  # json.dumps with these makes a new encoder per call


def _dumps(obj: dict) -> str:
    return _ENCODER.encode(obj)


def _sse(obj: dict) -> bytes:
    return f"data: {_dumps(obj)}\n\n".encode()


def _common_headers(response: HttpResponse, *, request, request_id: str, started: float) -> HttpResponse:
    response["x-request-id"] = request_id
    response["openai-processing-ms"] = str(int((time.perf_counter() - started) * 1000))
    client_id = request.headers.get("X-Client-Request-Id")
    if client_id and len(client_id) <= _MAX_CLIENT_REQUEST_ID and client_id.isascii() and client_id.isprintable():
        response["x-client-request-id"] = client_id
    return response


async def _authenticate(request):
    return await aapi_key_authenticate(authorization=request.headers.get("Authorization"))


def _body(request) -> dict:
    refused = getattr(request, "scope", {}).get(REFUSED_SCOPE_KEY)  # common.request_body: never read
    if refused is not None:
        raise ApiError(f"The request body is too large (limit {refused} bytes).", status=413, code="request_too_large")
    try:
        raw = request.body
    except RequestDataTooBig:
        raise ApiError(
            f"The request body is too large (limit {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes).", status=413,
            code="request_too_large"
        ) from None
    return json_object_parse(raw=raw)


async def _stream(run: JobRun, builder: ResponseBuilder) -> AsyncIterator[bytes]:
    """SSE events of one job; leaving early (disconnect) cancels it through `run`."""
    try:
        async with contextlib.aclosing(job_chunks(run, builder, keepalive=True)) as chunks:
            async for chunk in chunks:
                yield b": keep-alive\n\n" if chunk is None else _sse(chunk)
        yield b"data: [DONE]\n\n"
    except ApiError as exc:
        count_error(exc.status_code, exc.body())
        yield _sse(exc.body())
    except Exception:  # a bug after headers went out: still end with an error event
        logger.exception("stream of %s failed", run.request_id)
        body = error_body("The server had an error while processing your request.", error_type="server_error")
        count_error(500, body)
        yield _sse(body)


class _JobStreamingResponse(StreamingHttpResponse):
    """Cancels the job when Django closes the response, even if the stream never started."""

    def __init__(self, run: JobRun, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._run = run

    def close(self) -> None:
        self._run.cancel()  # no-op once the job finished or the stream already cancelled it
        self._run.release()  # stop waiting for its events (the stream may never have started)
        super().close()


async def _serve(request, endpoint: str) -> HttpResponse:
    started = time.perf_counter()
    request_id = request_id_new()
    prepared: PreparedRequest | None = None
    try:
        request.get_host()  # ALLOWED_HOSTS (DisallowedHost -> 400), as CommonMiddleware would check
        if request.method != "POST":
            raise ApiError(f"Method {request.method} is not allowed; use POST.", status=405, code="method_not_allowed")
        auth = await _authenticate(request)
        try:
            api_request = api_request_parse(endpoint=endpoint, body=_body(request))
            prepared = await arequest_prepare(auth=auth, request=api_request, request_id=request_id)
        except ApiError as exc:  # refused for its body: it still counts against the key's requests per minute
            await arequest_refused_count(auth=auth, request_id=request_id, error=exc)
            raise
        builder = response_builder(prepared=prepared)
        run = await ajob_submit(prepared=prepared)
        if api_request.stream:
            response = _JobStreamingResponse(run, _stream(run, builder), content_type="text/event-stream")
            response["Cache-Control"] = "no-cache"
            response["X-Accel-Buffering"] = "no"  # nginx: do not buffer the stream
        else:
            response = HttpResponse(_dumps(await job_collect(run, builder)), content_type="application/json")
    except DisallowedHost:
        response = error_json_response(InvalidRequest("Invalid Host header.", code="invalid_host"))
    except ApiError as exc:
        response = error_json_response(exc)
        if exc.status_code == 405:
            response["Allow"] = "POST"
    except Exception as exc:
        if connection_lost(exc):  # PostgreSQL (or Redis) away: the client may retry; never a 500
            _database_outage.failed(repr(exc))
            await sync_to_async(close_old_connections)()  # a broken connection is not kept for the next request
            response = error_json_response(ServiceUnavailable(
                "The service's database cannot be reached right now. Please retry shortly.",
                code="database_unavailable", headers={"Retry-After": "2"}))
        else:
            logger.exception("request %s failed", request_id)
            body = error_body("The server had an error while processing your request.", error_type="server_error")
            count_error(500, body)
            response = JsonResponse(body, status=500)
    if prepared is not None and prepared.admission is not None:
        for name, value in prepared.admission.headers.items():  # x-ratelimit-*: streamed, they go with the first bytes
            response[name] = value
    return _common_headers(response, request=request, request_id=request_id, started=started)


@csrf_exempt
async def chat_completions(request) -> HttpResponse:
    return await _serve(request, CHAT)


@csrf_exempt
async def completions(request) -> HttpResponse:
    return await _serve(request, COMPLETIONS)
