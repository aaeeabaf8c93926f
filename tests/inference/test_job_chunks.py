"""`job_chunks`: the one reader of a job's events that the JSON body, SSE and WebSocket all render."""

from __future__ import annotations

import pytest
from channels.layers import InMemoryChannelLayer

from common.errors import ApiError
from inference.api.job_run import JobRun, job_chunks
from inference.api.replies import reply_channel_get
from inference.api.responses import ResponseBuilder
from inference.api.schemas import CHAT, COMPLETIONS
from inference.protocol import Batch, Delta, Done, Usage

USAGE = Usage(prompt_tokens=7, cached_tokens=0, completion_tokens=3)


@pytest.fixture(autouse=True)
def no_queue(monkeypatch):
    """Cancelling a job here tells no queue (these jobs were never queued)."""
    from inference.api import job_run

    cancelled: list[str] = []
    monkeypatch.setattr(job_run, "job_cancel", lambda *, request_id: cancelled.append(request_id))
    return cancelled


def builder(endpoint: str, **fields) -> ResponseBuilder:
    return ResponseBuilder(endpoint=endpoint, request_id="r", created=1_700_000_000, model="m",
                           service_tier="default", **fields)


async def chunks_of(events: list, builder: ResponseBuilder, *, cancel: bool = False) -> list:
    reply = await reply_channel_get(InMemoryChannelLayer())
    run = JobRun(reply=reply, request_id="r", model="m")
    if cancel:
        run.cancel()  # a client's cancel frame (the queue's side is stubbed: see no_queue)
    reply.deliver(Batch(events))
    return [chunk async for chunk in job_chunks(run, builder)]


@pytest.mark.parametrize("endpoint", [CHAT, COMPLETIONS])
async def test_a_streams_chunks_and_the_whole_body_come_from_the_same_events(endpoint):
    events = [Delta("r", "Hi", [1]), Delta("r", "", [2]), Delta("r", " there", [3]), Done("r", "length", USAGE)]
    streamed = await chunks_of(events, builder(endpoint, include_usage=True))
    kinds = ["role"] * (endpoint == CHAT) + ["content", "content", "finish", "usage"]
    assert len(streamed) == len(kinds)  # the empty delta makes no chunk
    assert streamed[-2]["choices"][0]["finish_reason"] == "length" and streamed[-1]["usage"]["total_tokens"] == 10
    whole = builder(endpoint, collect=True)
    await chunks_of(events, whole)
    body = whole.collected(finish_reason="length", usage=USAGE)
    choice = body["choices"][0]
    assert (choice["message"]["content"] if endpoint == CHAT else choice["text"]) == "Hi there"
    assert body["usage"]["completion_tokens"] == 3


async def test_a_failed_job_raises_its_error_for_the_clients_parameter_after_its_content():
    events = [Delta("r", "Hi", [1]), Done("r", "error", USAGE, error="Too long.", error_param="prompt")]
    reply = await reply_channel_get(InMemoryChannelLayer())
    run = JobRun(reply=reply, request_id="r", model="m")
    reply.deliver(Batch(events))
    seen = []
    with pytest.raises(ApiError) as error:
        async for chunk in job_chunks(run, builder(CHAT)):
            seen.append(chunk)
    assert len(seen) == 2 and error.value.status_code == 400 and error.value.param == "messages"
    assert error.value.message == "Too long."


async def test_an_abort_this_side_asked_for_ends_after_the_content_without_a_finish_chunk():
    events = [Delta("r", "Hi", [1]), Done("r", "abort", USAGE)]
    assert len(await chunks_of(events, builder(COMPLETIONS), cancel=True)) == 1
    with pytest.raises(ApiError):  # one nobody asked for is the server's failure
        await chunks_of(events, builder(COMPLETIONS))
