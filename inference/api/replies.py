"""One reply channel per web process (per event loop), demultiplexed to the waiting requests.

Contract with the workers (inference.worker.events sends):
- Every Job of this process carries the same `reply_channel`: this process's
  channel, `reply.<layer client prefix>!<random>` on channels_redis, one per
  (channel layer, event loop).
- A worker sends each reply channel at most one message per engine step,
  `{"type": "engine.events", "events": [event, ...]}`: in order, every
  `engine.delta` / `engine.done` of that step for the jobs of that channel.
  A bare `engine.delta` / `engine.done` message is accepted too (one event).
- Each event names its `request_id`. `ReplyChannel` hands it to the JobRun
  registered for that id in this process, and to nobody else: request ids are
  server-made uuid4s, registered before their job is queued and unregistered
  when the request ends. Events for an id nobody waits for (a client that left,
  whose job still reports its abort) are dropped.

Why: with a channel per request, channels_redis pops one message (three Redis
round trips) at a time through one receive loop per process, a message per
generated token; at 32 streams that queueing cost the Redis mode a fifth of
its throughput (BENCHMARKS.md, serving). Now it is one message per process
per engine step.

The receive loop runs only while requests wait: when the last one leaves, the
loop sends itself `reply.stop` and ends on reading it (a receive is never
cancelled: channels_redis can lose a message popped by a cancelled receive).
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from typing import Any

from inference.worker.events import EVENTS

logger = logging.getLogger(__name__)

STOP = "reply.stop"
EVENT_TYPES = frozenset({"engine.delta", "engine.done"})


def events_unpack(message: dict) -> list[dict]:
    """The events one reply-channel message carries (a batch, or one bare event)."""
    kind = message.get("type")
    if kind == EVENTS:
        return [event for event in message.get("events") or () if isinstance(event, dict)]
    if kind in EVENT_TYPES:
        return [message]
    return []


class ReplyChannel:
    """This process's reply channel on one event loop, and the requests waiting on it."""

    def __init__(self, layer: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.layer = layer
        self.loop = loop
        self.name: str | None = None
        self._waiting: dict[str, asyncio.Queue] = {}
        self._task: asyncio.Task | None = None
        self._stop_sent = False

    async def open(self) -> str:
        # An idle receive blocks in channels_redis's BZPOPMIN for 5 s; settings.CHANNEL_LAYERS gives
        # redis-py a longer socket timeout (30 s), so that wait never races the socket's own timeout.
        if self.name is None:
            name = await self.layer.new_channel("reply.")
            if self.name is None:
                self.name = name
        return self.name

    # ------------------------------------------------------------ requests
    def register(self, request_id: str) -> asyncio.Queue:
        """The queue `request_id`'s events will arrive on (call before queueing its job)."""
        if self.name is None:
            raise RuntimeError("ReplyChannel.open() first")
        if request_id in self._waiting:
            raise ValueError(f"request {request_id!r} is already waiting on this reply channel")
        queue: asyncio.Queue = asyncio.Queue()
        self._waiting[request_id] = queue
        if self._task is None or self._task.done():
            self._task = self.loop.create_task(self._receive_loop(), name=f"replies {self.name}")
        return queue

    def unregister(self, request_id: str) -> None:
        self._waiting.pop(request_id, None)
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
        except Exception:  # noqa: BLE001 - the loop then idles in its receive until the next message
            self._stop_sent = False
            logger.exception("could not stop the reply loop of %s", self.name)

    async def _receive_loop(self) -> None:
        failures = 0
        while True:
            try:
                message = await self.layer.receive(self.name)
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - e.g. a Redis timeout; the requests keep waiting
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # a cancellation the client library turned into its own error
                failures += 1
                logger.exception("receiving on %s failed (%d in a row)", self.name, failures)
                await asyncio.sleep(min(1.0, 0.05 * 2**failures))
                continue
            if message.get("type") == STOP:
                self._stop_sent = False
                if not self._waiting:
                    return
                continue
            self.deliver(message)

    def deliver(self, message: dict) -> None:
        """Hand each event of `message` to the request it names, if it waits here."""
        for event in events_unpack(message):
            queue = self._waiting.get(event.get("request_id"))
            if queue is not None:
                queue.put_nowait(event)
            else:
                logger.debug("reply channel %s: event for %s, which nobody here waits for",
                             self.name, event.get("request_id"))


_channels: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, ReplyChannel]" = weakref.WeakKeyDictionary()


async def reply_channel_get(layer: Any) -> ReplyChannel:
    """The reply channel of the running event loop on `layer` (made on first use)."""
    loop = asyncio.get_running_loop()
    reply = _channels.get(loop)
    if reply is None or reply.layer is not layer:
        reply = _channels[loop] = ReplyChannel(layer, loop)
    await reply.open()
    return reply
