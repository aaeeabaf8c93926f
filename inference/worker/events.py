"""Sending a worker's events (inference.protocol) to reply channels.

The worker loop is plain synchronous code; channel layers are asyncio. An
`EventSink` owns the bridge: the loop hands it events without waiting, and one
drain task on an event loop sends them. Whatever piled up since the last send
(one engine step's deltas, and the done events of the requests that ended)
goes to each reply channel as ONE `Batch`, in the order the loop handed the
events over (the protocol module says why).

In-process receivers: a sink may be given the reply channels whose readers
live in its own process (`LocalReceivers`; the embedded worker's pool builds
its sink with the ones its web process opens). The sink then hands such a
channel's `Batch` straight to the receiver on its own event loop, in the same
loop callback that takes the events from the engine thread: the same one batch
per step, neither encoded nor sent twice through the channel layer's queues
(each a loop iteration behind every other stream's work). A sink without them
(separate worker processes) sends everything through the channel layer.

Delivery that fails (Redis restarting, a full channel) loses nothing at once:
the events are held and sent again, in order and before anything newer for
that channel, until the channel layer takes them; a channel holds a bounded
number for a bounded time (`_Drain._hold`). Every event carries its request's
sequence number (inference.protocol), so a reader that misses one knows.

Which event loop:
- Redis channel layer (separate worker processes): a private loop in a daemon
  thread of the sink.
- In-memory channel layer (embedded mode): the queues of InMemoryChannelLayer
  belong to the web server's event loop, and waking a receiver from another
  thread is not safe. The API calls `ensure_embedded_worker()` from that loop
  before it enqueues, which records it with `bind_event_loop`; the sink sends
  on the loop bound at the time of sending.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from common.outage import Outage
from inference.protocol import Batch, Done, Event, LocalReceiver

logger = logging.getLogger(__name__)

# Events whose sending failed (Redis restarting, a full channel) are sent again, in order, every
# RETRY_INTERVAL_S; a channel holds at most HOLD_MAX_EVENTS of them, each for at most HOLD_MAX_S.
RETRY_INTERVAL_S = 0.25
HOLD_MAX_EVENTS = 4096
HOLD_MAX_S = 120.0

_bound_loop: asyncio.AbstractEventLoop | None = None


class LocalReceivers:
    """Reply channels read in this process, by name: a sink given them hands their batches over directly.
    Weak: a closed reader drops out by itself."""

    def __init__(self) -> None:
        self._by_name: weakref.WeakValueDictionary[str, LocalReceiver] = weakref.WeakValueDictionary()

    def register(self, name: str, receiver: LocalReceiver) -> None:
        """Hand `name`'s batches to `receiver` directly when they are sent on its event loop."""
        self._by_name[name] = receiver

    def get(self, name: str) -> LocalReceiver | None:
        return self._by_name.get(name)

    def __len__(self) -> int:
        return len(self._by_name)


def bind_event_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Record the web server's event loop for the embedded worker's deliveries."""
    global _bound_loop
    _bound_loop = loop


def bound_event_loop() -> asyncio.AbstractEventLoop | None:
    loop = _bound_loop
    return None if loop is None or loop.is_closed() else loop


class _Drain:
    """The sending side on one event loop: an asyncio queue and its task."""

    def __init__(self, sink: "EventSink", loop: asyncio.AbstractEventLoop) -> None:
        self.sink = sink
        self.loop = loop
        self.queue: asyncio.Queue | None = None
        self.held: dict[str, list[Event]] = {}  # channel -> events whose sending failed, oldest first
        self.held_since: dict[str, float] = {}  # channel -> monotonic time of its first failed send
        self.outage = Outage(logger, "event delivery")
        loop.call_soon_threadsafe(self._start)

    def _start(self) -> None:
        self.queue = asyncio.Queue()
        self.task = self.loop.create_task(self._run())

    async def _stop(self) -> None:
        task = getattr(self, "task", None)
        if task is not None and not task.done():
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

    def stop(self, timeout: float = 2.0) -> None:
        if self.loop.is_closed() or not self.loop.is_running():
            return
        try:
            asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(timeout)
        except Exception:  # noqa: BLE001 - closing down anyway
            pass

    def put(self, batch: list[tuple[str, Event]], sent: threading.Event | None = None) -> None:
        self.loop.call_soon_threadsafe(self._put, batch, sent)

    def _put(self, batch: list[tuple[str, Event]], sent: threading.Event | None) -> None:
        local = self.sink.local
        rest = self._deliver_local(batch, local) if local else batch
        if rest:
            self.queue.put_nowait((rest, sent))
        elif sent is not None:
            sent.set()

    def _deliver_local(self, batch: list[tuple[str, Event]], receivers: LocalReceivers) -> list[tuple[str, Event]]:
        """Hand the batches of this loop's in-process reply channels over now; the rest is sent."""
        local: dict[str, tuple[Any, list[Event]]] = {}
        rest: list[tuple[str, Event]] = []
        for channel, event in batch:
            receiver = receivers.get(channel)
            if receiver is not None and receiver.loop is self.loop:
                local.setdefault(channel, (receiver, []))[1].append(event)
            else:
                rest.append((channel, event))
        count = 0
        for channel, (receiver, events) in local.items():
            count += len(events)
            try:
                receiver.deliver(Batch(events))
            except Exception:  # noqa: BLE001 - one broken reader must not stop the others
                logger.exception("in-process delivery of %d events to %s failed", len(events), channel)
        if count:
            self.sink._sent(count)
        return rest

    async def _run(self) -> None:
        while True:
            if self.held:  # something waits to be sent again: wake up for it
                try:
                    batches = [await asyncio.wait_for(self.queue.get(), RETRY_INTERVAL_S)]
                except TimeoutError:
                    batches = []
            else:
                batches = [await self.queue.get()]
            while not self.queue.empty():
                batches.append(self.queue.get_nowait())
            by_channel: dict[str, list[Event]] = {channel: held for channel, held in self.held.items()}
            self.held = {}
            count = 0
            for batch, _sent in batches:
                for channel, event in batch:
                    by_channel.setdefault(channel, []).append(event)
            results = await asyncio.gather(*(self._send_batch(channel, events) for channel, events in by_channel.items()))
            for (channel, events), delivered in zip(by_channel.items(), results):
                if delivered:
                    count += len(events)
                else:
                    count += self._hold(channel, events)
            if not self.held:
                self.outage.ok()
            self.sink._sent(count)
            for _batch, sent in batches:
                if sent is not None:
                    sent.set()

    def _hold(self, channel: str, events: list[Event]) -> int:
        """Keep `events` to send again, in order, before anything newer for `channel`; returns how many were
        given up: the oldest deltas past HOLD_MAX_EVENTS, or everything held longer than HOLD_MAX_S (its
        reader is gone). A `Done` is kept while its channel is: the reader learns how its request ended
        and, from the numbers, that text is missing (inference.api.job_run)."""
        now = time.monotonic()
        since = self.held_since.setdefault(channel, now)
        if now - since > HOLD_MAX_S:
            self.held_since.pop(channel, None)
            logger.error("gave up delivering %d events to %s after %.0f s", len(events), channel, now - since)
            return len(events)
        dropped = 0
        while len(events) > HOLD_MAX_EVENTS:
            index = next((i for i, event in enumerate(events) if type(event) is not Done), None)
            if index is None:
                break
            del events[index]
            dropped += 1
        if dropped:
            logger.error("dropped %d undeliverable events for %s (more than %d held)", dropped, channel,
                         HOLD_MAX_EVENTS)
        self.held[channel] = events
        return dropped

    async def _send_batch(self, channel: str, events: list[Event]) -> bool:
        try:
            await self.sink.layer.send(channel, Batch(events).encode())
        except Exception as exc:  # noqa: BLE001 - a full or broken channel must not stop the others
            self.outage.failed(f"could not deliver {len(events)} events ({events[0].request_id}...) to {channel}: "
                               f"{exc!r}; holding them to send again")
            return False
        self.held_since.pop(channel, None)
        return True


class EventSink:
    """Thread-safe, non-blocking, per-channel-ordered delivery to a channel layer.

    `loop`: None for a private event loop thread; an event loop; or a callable
    returning the loop to use at each send (the embedded mode passes
    `bound_event_loop`). `local`: the reply channels read in this process, handed
    their batches directly (the embedded mode's); None: everything goes through
    the channel layer.
    """

    def __init__(self, layer: Any = None, loop: asyncio.AbstractEventLoop | Callable[[], Any] | None = None,
                 local: LocalReceivers | None = None) -> None:
        self._layer = layer
        self.local = local
        self._loop_source = loop
        self._own_loop: asyncio.AbstractEventLoop | None = None
        self._drains: dict[int, _Drain] = {}
        self._lock = threading.Lock()
        self._pending = 0
        self._idle = threading.Condition(self._lock)

    @property
    def layer(self) -> Any:
        if self._layer is None:
            from channels.layers import get_channel_layer

            self._layer = get_channel_layer()
        return self._layer

    def _target_loop(self) -> asyncio.AbstractEventLoop:
        source = self._loop_source
        loop = source() if callable(source) else source
        if loop is not None and not loop.is_closed():
            return loop
        if source is not None:
            logger.warning("no web event loop bound for embedded delivery; using a private loop")
        if self._own_loop is None:
            self._own_loop = asyncio.new_event_loop()
            threading.Thread(target=self._own_loop.run_forever, name="event-sink", daemon=True).start()
        return self._own_loop

    def send_many(self, items: list[tuple[str, Event]], *, wait_s: float = 0.0) -> None:
        """Hand `items` over; with `wait_s`, also wait (at most that long) until they are sent.

        The caller (the engine thread) holds the GIL through the Python of its
        next step: the sending loop's thread could not run until the step's
        first native call, which delays every first token. Waiting on an Event
        releases the GIL, and the events go out at once; the worker waits only
        for steps that carry first tokens.
        """
        if not items:
            return
        sent = threading.Event() if wait_s > 0 else None
        with self._lock:
            loop = self._target_loop()
            drain = self._drains.get(id(loop))
            if drain is None or drain.loop is not loop:
                for key in [key for key, old in self._drains.items() if old.loop.is_closed()]:
                    del self._drains[key]
                drain = self._drains[id(loop)] = _Drain(self, loop)
            self._pending += len(items)
            try:
                drain.put(list(items), sent)
            except RuntimeError as exc:  # the loop closed between the check and the call
                self._pending -= len(items)
                self._drains.pop(id(loop), None)
                logger.warning("dropping %d events: %s", len(items), exc)
                return
        if sent is not None:
            sent.wait(wait_s)

    def send(self, channel: str, event: Event) -> None:
        self.send_many([(channel, event)])

    def _sent(self, count: int) -> None:
        with self._idle:
            self._pending -= count
            if self._pending <= 0:
                self._idle.notify_all()

    def close(self) -> None:
        """Stop the drain tasks (after flush() if pending events matter) and the private loop."""
        with self._lock:
            drains = list(self._drains.values())
            self._drains.clear()
        for drain in drains:
            drain.stop()
        if self._own_loop is not None:
            self._own_loop.call_soon_threadsafe(self._own_loop.stop)
            self._own_loop = None

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything handed over so far was sent (or failed)."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending <= 0, timeout=timeout)


_default_sink: EventSink | None = None
_default_lock = threading.Lock()


def default_sink() -> EventSink:
    """The process-wide sink on a private event loop (worker processes, Celery)."""
    global _default_sink
    with _default_lock:
        if _default_sink is None:
            _default_sink = EventSink()
        return _default_sink
