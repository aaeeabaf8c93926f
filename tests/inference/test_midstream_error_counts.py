"""Errors sent after a response began count in the console's errors by code, as error responses do:
an SSE stream's error event and a WebSocket error frame (common.live_counts)."""

from __future__ import annotations

import json

import pytest
from channels.layers import InMemoryChannelLayer
from asgiref.testing import ApplicationCommunicator

from common.live_counts import ERRORS, event_counts, live_counts_clear
from inference.api.job_run import JobRun
from inference.api.replies import reply_channel_get
from inference.api.responses import ResponseBuilder
from inference.api.schemas import CHAT
from inference.api.completion_views import _stream
from inference.consumers import RealtimeConsumer
from inference.protocol import Batch, Delta, Done, Usage


@pytest.fixture(autouse=True)
def counts(monkeypatch, settings):
    from inference.api import job_run

    settings.REDIS_URL = ""  # this process's counts
    monkeypatch.setattr(job_run, "job_cancel", lambda *, request_id: None)  # these jobs were never queued
    live_counts_clear()
    yield
    live_counts_clear()


async def test_an_sse_error_event_is_counted():
    reply = await reply_channel_get(InMemoryChannelLayer())
    run = JobRun(reply=reply, request_id="r", model="m")
    reply.deliver(Batch([Delta("r", "Hi", [1]), Done("r", "error", Usage(7, 0, 1), error="the GPU fell over")]))
    builder = ResponseBuilder(endpoint=CHAT, request_id="r", created=1_700_000_000, model="m", service_tier="default")
    events = [event async for event in _stream(run, builder)]
    error = json.loads(events[-1].decode().removeprefix("data: "))["error"]
    assert error["type"] == "server_error" and "the GPU fell over" in error["message"]
    assert event_counts(ERRORS) == {f"500 {error['code'] or error['type']}": 1}


@pytest.mark.django_db  # channels closes old database connections around a consumer's events
async def test_websocket_error_frames_are_counted():
    scope = {"type": "websocket", "path": "/v1/realtime", "headers": [], "subprotocols": []}
    socket = ApplicationCommunicator(RealtimeConsumer.as_asgi(), scope)
    await socket.send_input({"type": "websocket.connect"})
    assert (await socket.receive_output(5))["type"] == "websocket.accept"

    async def exchange(text: str) -> dict:
        await socket.send_input({"type": "websocket.receive", "text": text})
        return json.loads((await socket.receive_output(5))["text"])

    frame = await exchange("{not json")
    early = await exchange(json.dumps({"type": "request", "id": "early", "endpoint": "chat.completions", "body": {}}))
    await socket.send_input({"type": "websocket.disconnect", "code": 1000})
    await socket.wait(5)
    assert frame["type"] == "error" and early["error"]["code"] == "invalid_api_key"
    assert event_counts(ERRORS) == {f"400 {frame['error']['code']}": 1, "401 invalid_api_key": 1}
