"""The shared per-process reply channel: worker batches demultiplexed to the right request only.

Runs on the in-memory channel layer, and on channels_redis when a Redis server
is there (db 2, as the queue tests; skipped locally without one, required
under CI=true).
"""

from __future__ import annotations

import asyncio

import pytest
from channels.layers import InMemoryChannelLayer

from inference.api.job_run import JobRun
from inference.api.replies import ReplyChannel, reply_channel_get
from inference.protocol import BATCH, Batch, Delta, Done, Usage
from inference.serving import get_worker_pool
from inference.worker.events import EventSink
from tests.inference.queue_helpers import REDIS_TEST_URL, require_redis


def delta(request_id: str, text: str) -> Delta:
    return Delta(request_id, text, [1])


def done(request_id: str, completion_tokens: int) -> Done:
    return Done(request_id, "length", Usage(prompt_tokens=3, completion_tokens=completion_tokens))


def batch(*events) -> dict:
    """What a worker sends a reply channel: one Batch, encoded for the channel layer."""
    return Batch(list(events)).encode()


def texts(events) -> list:
    return [getattr(event, "text", None) for event in events]


@pytest.fixture(params=["memory", "redis"])
async def layer(request):
    if request.param == "memory":
        layer = InMemoryChannelLayer()
    else:
        require_redis()
        from inference.channel_layer import RedisChannelLayer

        layer = RedisChannelLayer(hosts=[{"address": REDIS_TEST_URL, "socket_timeout": 30}], prefix="test-replies:")
    yield layer
    # Every test ends with nobody waiting: the receive loop must have stopped by itself.
    reply = await reply_channel_get(layer)
    if reply._task is not None:
        await asyncio.wait_for(asyncio.shield(reply._task), 10)
    if request.param == "redis":
        await layer.flush()


async def read_all(run: JobRun, timeout: float = 10.0) -> list:
    events = []
    async with run:
        async for event in run.events(idle_s=timeout):
            assert event is not None, "timed out"
            events.append(event)
    return events


async def test_one_batch_for_two_tenants_reaches_each_request_and_nobody_else(layer):
    reply = await reply_channel_get(layer)
    alice = JobRun(reply=reply, request_id="req-alice", model="m")
    bob = JobRun(reply=reply, request_id="req-bob", model="m")
    # What a worker sends for one step: both requests' deltas in one message,
    # plus an event for a request this process does not serve (a stale one).
    await layer.send(reply.name, batch(
        delta("req-alice", "A1"), delta("req-bob", "B1"), delta("req-stranger", "S1"), delta("req-alice", "A2"),
    ))
    await layer.send(reply.name, batch(done("req-bob", 1), delta("req-alice", "A3"), done("req-alice", 3)))
    alice_events, bob_events = await asyncio.gather(read_all(alice), read_all(bob))
    assert texts(alice_events) == ["A1", "A2", "A3", None]
    assert texts(bob_events) == ["B1", None]
    assert {e.request_id for e in alice_events} == {"req-alice"}
    assert {e.request_id for e in bob_events} == {"req-bob"}
    assert alice.done.usage.completion_tokens == 3 and bob.done.usage.completion_tokens == 1
    assert reply.waiting == 0


async def test_events_of_a_request_that_left_are_dropped_not_rerouted(layer):
    reply = await reply_channel_get(layer)
    gone = JobRun(reply=reply, request_id="req-gone", model="m")
    stays = JobRun(reply=reply, request_id="req-stays", model="m")
    gone.release()  # the client left (its job's abort event still comes)
    await layer.send(reply.name, batch(delta("req-gone", "secret"), done("req-gone", 1)))
    await layer.send(reply.name, batch(delta("req-stays", "mine"), done("req-stays", 1)))
    assert texts(await read_all(stays)) == ["mine", None]


async def test_a_message_or_event_it_does_not_know_is_dropped_and_the_rest_still_arrive(layer):
    reply = await reply_channel_get(layer)
    run = JobRun(reply=reply, request_id="req-new", model="m")
    await layer.send(reply.name, delta("req-new", "bare").encode())  # an event outside a batch
    message = batch(delta("req-new", "x"), done("req-new", 1))
    message["events"].insert(1, {"type": "engine.future", "request_id": "req-new"})  # a newer worker's
    await layer.send(reply.name, message)
    assert [type(e) for e in await read_all(run)] == [Delta, Done]


async def test_the_receive_loop_stops_when_idle_and_restarts_for_the_next_request(layer):
    reply = await reply_channel_get(layer)
    first = JobRun(reply=reply, request_id="req-1", model="m")
    task = reply._task
    assert task is not None and not task.done()
    await layer.send(reply.name, batch(done("req-1", 0)))
    await read_all(first)
    await asyncio.wait_for(asyncio.shield(task), 10)  # ended by its own stop message
    second = JobRun(reply=reply, request_id="req-2", model="m")
    assert reply._task is not task and not reply._task.done()
    await layer.send(reply.name, batch(done("req-2", 0)))
    assert [type(e) for e in await read_all(second)] == [Done]
    await asyncio.wait_for(asyncio.shield(reply._task), 10)


async def test_a_request_registered_while_the_stop_is_in_flight_still_gets_its_events(layer):
    reply = await reply_channel_get(layer)
    first = JobRun(reply=reply, request_id="req-a", model="m")
    first.release()  # last one out: the stop message goes out
    second = JobRun(reply=reply, request_id="req-b", model="m")  # before the loop read the stop
    await layer.send(reply.name, batch(delta("req-b", "hi"), done("req-b", 1)))
    assert texts(await read_all(second)) == ["hi", None]


async def test_on_redis_the_reply_channel_is_a_single_reader_channel_with_no_backup_copies(monkeypatch):
    require_redis()
    import redis

    from inference.channel_layer import RedisChannelLayer

    layer = RedisChannelLayer(hosts=[{"address": REDIS_TEST_URL, "socket_timeout": 30}], prefix="test-replies:")
    monkeypatch.setattr(layer, "receive", lambda channel: pytest.fail("channels_redis's receive was used"))
    reply = await reply_channel_get(layer)
    assert reply.name.startswith(f"reply.{layer.client_prefix}.") and reply.name.endswith("!")
    run = JobRun(reply=reply, request_id="req-r", model="m")
    await layer.send(reply.name, batch(delta("req-r", "x"), done("req-r", 1)))
    assert texts(await read_all(run)) == ["x", None]
    await asyncio.wait_for(asyncio.shield(reply._task), 10)
    client = redis.Redis.from_url(REDIS_TEST_URL)
    assert client.keys(layer.prefix + "*") == []  # popped, and no "$inflight" backup set
    client.close()
    await layer.flush()


async def test_one_request_id_cannot_wait_twice():
    reply = await reply_channel_get(InMemoryChannelLayer())
    run = JobRun(reply=reply, request_id="req-x", model="m")
    with pytest.raises(ValueError):
        JobRun(reply=reply, request_id="req-x", model="m")
    run.release()
    with pytest.raises(RuntimeError):
        ReplyChannel(InMemoryChannelLayer(), asyncio.get_running_loop()).register("req-y")


async def test_the_sink_sends_one_message_per_reply_channel_per_hand_over():
    layer = InMemoryChannelLayer()
    sink = EventSink(layer, loop=asyncio.get_running_loop())
    one, two = await layer.new_channel("reply."), await layer.new_channel("reply.")
    sink.send_many([(one, delta("r1", "a")), (two, delta("r2", "b")), (one, delta("r3", "c")), (one, done("r1", 1))])
    await asyncio.to_thread(sink.flush, 5.0)
    message = await asyncio.wait_for(layer.receive(one), 5)
    assert message["type"] == BATCH
    assert [(e.request_id, type(e)) for e in Batch.decode(message).events] == [("r1", Delta), ("r3", Delta), ("r1", Done)]
    assert [e.request_id for e in Batch.decode(await asyncio.wait_for(layer.receive(two), 5)).events] == ["r2"]
    sink.close()


async def test_a_stream_closed_before_it_started_cancels_its_job_and_stops_waiting(monkeypatch):
    from inference.api import completion_views, job_run

    cancelled = []
    monkeypatch.setattr(job_run, "job_cancel", lambda *, request_id: cancelled.append(request_id))
    reply = await reply_channel_get(InMemoryChannelLayer())
    run = JobRun(reply=reply, request_id="req-never-read", model="m")

    async def body():
        yield b""

    response = completion_views._JobStreamingResponse(run, body(), content_type="text/event-stream")
    response.close()  # what Django does when the client left before the first byte
    assert cancelled == ["req-never-read"] and reply.waiting == 0
    await asyncio.wait_for(asyncio.shield(reply._task), 5)


async def test_a_mailbox_wait_that_times_out_loses_nothing_and_a_put_wakes_the_reader():
    from inference.api.replies import Mailbox

    mailbox = Mailbox()
    assert await mailbox.wait(0.01) is False  # a keep-alive tick: nothing taken
    mailbox.put_nowait({"n": 1})
    assert await mailbox.wait(0.01) is True and mailbox.get_nowait() == {"n": 1}
    reader = asyncio.ensure_future(mailbox.wait(30))
    await asyncio.sleep(0)
    mailbox.put_nowait({"n": 2})
    assert await asyncio.wait_for(reader, 5) is True
    assert mailbox.get_nowait() == {"n": 2} and mailbox.empty()
    reader = asyncio.ensure_future(mailbox.wait(30))
    await asyncio.sleep(0)
    mailbox.close()  # the request left: a waiting reader is cancelled, not left hanging
    with pytest.raises(asyncio.CancelledError):
        await reader


async def test_keepalive_ticks_between_events_lose_none_of_them():
    reply = await reply_channel_get(InMemoryChannelLayer())
    run = JobRun(reply=reply, request_id="req-slow", model="m")
    assert await run.next_event(0.01) is None  # idle: a keep-alive tick
    reply.deliver(Batch([delta("req-slow", "a")]))
    assert (await run.next_event(0.01)).text == "a"
    assert await run.next_event(0.01) is None
    reply.deliver(Batch([delta("req-slow", "b"), done("req-slow", 2)]))
    assert (await run.next_event(0.01)).text == "b"
    assert type(await run.next_event(0.01)) is Done and run.done is not None
    run.release()


class _RefusingLayer(InMemoryChannelLayer):
    """A layer whose sends fail: what reaches a reader came the in-process way."""

    async def send(self, channel, message):
        raise AssertionError(f"sent through the channel layer to {channel}")


async def test_the_sink_hands_an_in_process_reply_channel_its_batch_directly(settings):
    settings.EMBEDDED_WORKER = True  # the engine in this process: its pool registers the reply channel
    layer = _RefusingLayer()
    reply = await reply_channel_get(layer)
    first = JobRun(reply=reply, request_id="req-p", model="m")
    second = JobRun(reply=reply, request_id="req-q", model="m")
    # built as the embedded pool builds its engine's sink: given the reply channels this process opens
    sink = EventSink(layer, loop=asyncio.get_running_loop(), local=get_worker_pool().receivers)
    await asyncio.to_thread(sink.send_many, [(reply.name, delta("req-p", "a")), (reply.name, delta("req-q", "b"))])
    await asyncio.to_thread(sink.send_many, [(reply.name, delta("req-p", "c")), (reply.name, done("req-p", 2)),
                                              (reply.name, done("req-q", 1))])
    assert await asyncio.to_thread(sink.flush, 5.0)
    p_events, q_events = await asyncio.gather(read_all(first), read_all(second))
    assert texts(p_events) == ["a", "c", None]
    assert texts(q_events) == ["b", None]
    sink.close()


async def test_a_sink_not_given_the_in_process_reply_channels_sends_through_the_layer(settings):
    settings.EMBEDDED_WORKER = True  # the reply channel is an in-process one ...
    sent = []

    class Recording(InMemoryChannelLayer):
        async def send(self, channel, message):
            sent.append(channel)
            await super().send(channel, message)

    reply = await reply_channel_get(Recording())
    run = JobRun(reply=reply, request_id="req-s", model="m")
    sink = EventSink(reply.layer, loop=asyncio.get_running_loop())  # ... but this sink (a worker process's) has none
    await asyncio.to_thread(sink.send_many, [(reply.name, delta("req-s", "a")), (reply.name, done("req-s", 1))])
    assert await asyncio.to_thread(sink.flush, 5.0)
    assert texts(await read_all(run)) == ["a", None]
    assert sent == [reply.name]  # one batch, through the channel layer
    sink.close()


async def test_send_many_with_a_wait_returns_once_the_events_are_delivered(settings):
    settings.EMBEDDED_WORKER = True  # the embedded engine's sink, which hands the reply channel its batch
    reply = await reply_channel_get(InMemoryChannelLayer())
    run = JobRun(reply=reply, request_id="req-w", model="m")
    sink = EventSink(reply.layer, loop=asyncio.get_running_loop(), local=get_worker_pool().receivers)

    def engine_thread() -> bool:
        sink.send_many([(reply.name, delta("req-w", "first"))], wait_s=5.0)
        return not run._mailbox.empty()  # read right after the call returned, from the engine's thread

    assert await asyncio.to_thread(engine_thread)
    assert (await run.next_event(1)).text == "first"
    run.release()
    sink.close()
