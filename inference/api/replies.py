"""One reply channel per web process (per event loop), demultiplexed to the waiting requests.

Contract with the workers (the events and their batches: inference.protocol):
- Every Job of this process carries the same `reply_channel`: this process's
  channel, one per (channel layer, event loop); on the Redis layer a
  single-reader channel `reply.<layer client prefix>.<random>!` with a key of
  its own (inference.channel_layer).
- A worker sends each reply channel at most one `Batch` per engine step.
- Each event names its `request_id`. `ReplyChannel` hands it to the JobRun
  registered for that id in this process, and to nobody else: request ids are
  server-made uuid4s, registered before their job is queued and unregistered
  when the request ends. Events for an id nobody waits for (a client that left,
  whose job still reports its abort) are dropped.

Why: with a channel per request, channels_redis pops one message (three Redis
round trips) at a time through one receive loop per process, a message per
generated token, and under many streams that queue, not the engine, set the
Redis mode's throughput. Now it is one message per process per engine step.

An engine in this same process (the embedded worker) skips the channel layer:
the worker's sink calls `deliver` on the reply channel's event loop directly
with the `Batch` itself (inference.protocol, in-process delivery), once the worker
pool (inference.serving) registered the channel when it opened.

Liveness: while requests wait, the channel refreshes a key in the queue's
store every settings.REPLY_ALIVE_INTERVAL_S (`JobQueue.reply_channels_touch`,
expiring after REPLY_ALIVE_TIMEOUT_S), the first time before its job is queued
(`alive`). A worker holding jobs of a channel whose key is gone cancels them
(inference.worker.loop): a web process killed mid-stream leaves no job
generating for nobody.

The receive loop runs only while requests wait: when the last one leaves, the
loop sends itself `reply.stop` and ends on reading it. A receive is never
cancelled (only a closing event loop ends one): the Redis layer's single-reader
receive pops without a backup copy, so a cancelled one could lose a message.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections import deque
from typing import Any

from django.conf import settings

from common.outage import Outage
from inference.protocol import Batch, Event
from inference.serving import get_worker_pool

logger = logging.getLogger(__name__)
_receive_outage = Outage(logger, "web: reply channel (Redis)")
_alive_outage = Outage(logger, "web: reply channel liveness key (Redis)")

STOP = "reply.stop"


class Mailbox:
    """One request's events not yet read, on its event loop (what `register` hands its JobRun).

    A deque and at most one waiter future: an event put here wakes the reader
    in the loop's next iteration. (An asyncio.Queue read with a timeout needs a
    getter task and `asyncio.wait` around it: three iterations per event, each
    one behind every other stream's work of that step.)
    """

    __slots__ = ("_events", "_waiter", "closed")

    def __init__(self) -> None:
        self._events: deque = deque()
        self._waiter: asyncio.Future | None = None
        self.closed = False

    def put_nowait(self, event: Event) -> None:
        self._events.append(event)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(True)

    def get_nowait(self) -> Event:
        """The oldest event (IndexError when there is none)."""
        return self._events.popleft()

    def empty(self) -> bool:
        return not self._events

    async def wait(self, timeout: float | None) -> bool:
        """Wait until an event is there (True) or `timeout` seconds pass (False).

        Nothing is taken while waiting, so a timeout or a cancellation loses no
        event. After `close()` a waiting or new call raises CancelledError.
        """
        if self._events:
            return True
        if self.closed:
            raise asyncio.CancelledError("mailbox closed")
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = None if timeout is None else loop.call_later(timeout, _wake, waiter, False)
        try:
            return await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()

    def close(self) -> None:
        """No more events for this request: a reader waiting now is cancelled."""
        self.closed = True
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.cancel()


def _wake(waiter: asyncio.Future, value: bool) -> None:
    if not waiter.done():
        waiter.set_result(value)


class ReplyChannel:
    """This process's reply channel on one event loop, and the requests waiting on it."""

    def __init__(self, layer: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.layer = layer
        self.loop = loop
        self.name: str | None = None
        self._waiting: dict[str, Mailbox] = {}
        self._task: asyncio.Task | None = None
        self._stop_sent = False
        self._receive = layer.receive  # the layer's own, unless open() finds a single-reader channel
        self._touched_at = 0.0  # monotonic time of the last liveness refresh
        self._toucher: asyncio.Task | None = None

    async def open(self) -> str:
        # An idle receive blocks in a BZPOPMIN for 5 s; settings.CHANNEL_LAYERS gives redis-py a
        # longer socket timeout (30 s), so that wait never races the socket's own timeout.
        if self.name is None:
            single = getattr(self.layer, "new_single_reader_channel", None)
            name = await (single("reply") if single is not None else self.layer.new_channel("reply."))
            if self.name is None:
                self.name = name
                if single is not None:
                    # this loop is the channel's one reader and is not cancelled while requests wait
                    # (see _receive_loop): on our Redis layer it pops without channels_redis's backups
                    self._receive = self.layer.receive_single_reader
                # an engine thread in this process (embedded worker) delivers here without the layer
                get_worker_pool().reply_channel_opened(name, self)
        return self.name

    # ------------------------------------------------------------ liveness
    async def alive(self) -> None:
        """Refresh this channel's liveness key now unless done lately, and keep refreshing it while
        requests wait (call before queueing a job)."""
        if time.monotonic() - self._touched_at > settings.REPLY_ALIVE_INTERVAL_S / 2:
            await self._touch()
        if self._toucher is None or self._toucher.done():
            self._toucher = self.loop.create_task(self._keep_alive(), name=f"alive {self.name}")

    async def _touch(self) -> None:
        from inference.queue import get_job_queue

        try:
            await asyncio.to_thread(get_job_queue().reply_channels_touch, [self.name],
                                    settings.REPLY_ALIVE_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - Redis away: the workers wait for the key to come back
            _alive_outage.failed(exc)
            return
        _alive_outage.ok()
        self._touched_at = time.monotonic()

    async def _keep_alive(self) -> None:
        while self._waiting:
            await asyncio.sleep(settings.REPLY_ALIVE_INTERVAL_S)
            await self._touch()

    # ------------------------------------------------------------ requests
    def register(self, request_id: str) -> Mailbox:
        """The mailbox `request_id`'s events will arrive in (call before queueing its job)."""
        if self.name is None:
            raise RuntimeError("ReplyChannel.open() first")
        if request_id in self._waiting:
            raise ValueError(f"request {request_id!r} is already waiting on this reply channel")
        mailbox = Mailbox()
        self._waiting[request_id] = mailbox
        if self._task is None or self._task.done():
            self._task = self.loop.create_task(self._receive_loop(), name=f"replies {self.name}")
        return mailbox

    def unregister(self, request_id: str) -> None:
        mailbox = self._waiting.pop(request_id, None)
        if mailbox is not None:
            mailbox.close()
        if not self._waiting and self._task is not None and not self._task.done() and not self._stop_sent:
            self._stop_sent = True
            self.loop.create_task(self._send_stop())

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    # ------------------------------------------------------------ receiving
    async def _send_stop(self) -> None:
        try:
            await self.layer.send(self.name, {"type": STOP})
        except Exception as exc:  # noqa: BLE001 - the loop then idles in its receive until the next message
            self._stop_sent = False
            _receive_outage.failed(f"could not stop the reply loop of {self.name}: {exc!r}")

    async def _receive_loop(self) -> None:
        failures = 0
        while True:
            try:
                message = await self._receive(self.name)
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - e.g. a Redis timeout; the requests keep waiting
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # a cancellation the client library turned into its own error
                failures += 1
                _receive_outage.failed(f"receiving on {self.name} failed ({failures} in a row)")
                await asyncio.sleep(min(1.0, 0.05 * 2**failures))
                continue
            _receive_outage.ok()
            if message.get("type") == STOP:
                self._stop_sent = False
                if not self._waiting:
                    return
                continue
            self.deliver(Batch.decode(message))
            # the requests this woke write their events before the next pop is sent: a Redis
            # command written first would delay each step's first token
            await asyncio.sleep(0)

    def deliver(self, batch: Batch) -> None:
        """Hand each event of `batch` to the request it names, if it waits here."""
        for event in batch.events:
            mailbox = self._waiting.get(event.request_id)
            if mailbox is not None:
                mailbox.put_nowait(event)
            else:
                logger.debug("reply channel %s: event for %s, which nobody here waits for",
                             self.name, event.request_id)


_channels: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, ReplyChannel]" = weakref.WeakKeyDictionary()


async def reply_channel_get(layer: Any) -> ReplyChannel:
    """The reply channel of the running event loop on `layer` (made on first use)."""
    loop = asyncio.get_running_loop()
    reply = _channels.get(loop)
    if reply is None or reply.layer is not layer:
        reply = _channels[loop] = ReplyChannel(layer, loop)
    await reply.open()
    return reply
