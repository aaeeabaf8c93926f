"""Telling every web process, within a second, that an API key, a tenant or a tier changed.

What a change must reach: the verified-key cache (`api_key_cache`: rows kept
~2 s, and the unknown prefixes) and the WebSockets open on the key (a socket
authenticates once and then lives for hours; `inference.consumers` re-checks
its key when told, and closes if the key is no longer allowed).

- In this process: every save or delete of an ApiKey, Tenant or Tier (or of a
  tier's per-model limit, TierModelLimit: an event of its tier) (the
  post_save/post_delete hook, `connect`), and `api_key_revoke`'s queryset
  update (`key_event_send`), empty the cache at once, and again once the
  transaction commits; at the commit the sockets watching the key, tenant or
  tier are told (`key_watch_start`): they re-check through the emptied cache,
  so they read the committed row.
- Every other web process: at the commit, when REDIS_URL is set, the event is
  published on the Redis channel `tenants:key-events:<db>` (pub/sub ignores
  the database number, so it is in the name). Each web process's event loop
  listens (`key_events_listen_ensure`, started lazily by the first key check,
  like the cache's keep-warm task) and does the same as above: a revocation in
  process A closes a socket in process B within milliseconds. A listener that
  loses Redis logs it once (common.outage), retries every second or two, and
  on subscribing again forgets every cached row and re-checks every socket
  (events published meanwhile are lost). While Redis is away, the cache's TTL
  still bounds how long another process serves a changed key's requests, as
  it does for a row cached in the moment before the first subscription.
- Embedded mode (no REDIS_URL): one web process, so the local path is all.

Events name what changed (`prefix`, `tenant_id`, `tier_id`); the cache is
emptied whole regardless (a row carries its tenant and tier), and only the
matching sockets re-check. A key's expiry needs no event: the watch schedules
a re-check at `expires_at`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import uuid
from collections.abc import Callable
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from common.outage import Outage
from tenants.services.api_key_cache import api_key_cache_clear

logger = logging.getLogger(__name__)

RETRY_MIN_S = 0.5
RETRY_MAX_S = 2.0
PING_EVERY_S = 5.0  # a silent dead connection shows as a failed ping, not as a listener that hears nothing
EXPIRY_SLACK_S = 0.05  # the re-check at expiry runs just after it, when `expires_at <= now` holds

_ORIGIN = uuid.uuid4().hex  # this process: it skips its own events coming back from Redis
_publish_outage = Outage(logger, "key events: publishing (Redis)")
_listen_outage = Outage(logger, "key events: listening (Redis)")
_publisher = None  # (url, redis.Redis)
_listener: asyncio.Task | None = None
_subscribed = threading.Event()  # set while the listener holds a subscription (tests wait on it)


def channel_name(url: str | None = None) -> str:
    from redis.connection import parse_url

    db = parse_url(url or settings.REDIS_URL).get("db", 0)
    return f"tenants:key-events:{db}"


# ---------------------------------------------------------------- sending
def key_event_send(*, prefix: str | None = None, tenant_id: int | None = None, tier_id: int | None = None) -> None:
    """A key, tenant or tier changed: empty this process's cache now, and at the commit tell this process's
    sockets and every other web process (see the module docstring)."""
    api_key_cache_clear()
    event = {"prefix": prefix, "tenant_id": tenant_id, "tier_id": tier_id}
    transaction.on_commit(lambda: _committed(event))


def _committed(event: dict) -> None:
    _deliver(event)
    if settings.REDIS_URL:
        _publish(event)


def _publish(event: dict) -> None:
    """Never raises: the change itself is committed; other processes then see it at the cache's TTL."""
    global _publisher
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    url = settings.REDIS_URL
    try:
        if _publisher is None or _publisher[0] != url:
            # one retry: after a Redis restart the pool's idle connection is dead, the next one is not
            _publisher = (url, redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1,
                                                    retry=Retry(NoBackoff(), 1)))
        _publisher[1].publish(channel_name(url), json.dumps({**event, "origin": _ORIGIN}))
    except (redis.RedisError, OSError) as exc:
        _publish_outage.failed(exc)
        return
    _publish_outage.ok()


def _on_api_key(sender, instance, **_kwargs) -> None:
    key_event_send(prefix=instance.prefix or None, tenant_id=instance.tenant_id)


def _on_tenant(sender, instance, **_kwargs) -> None:
    key_event_send(tenant_id=instance.pk)


def _on_tier(sender, instance, **_kwargs) -> None:
    key_event_send(tier_id=instance.pk)


def _on_tier_model_limit(sender, instance, **_kwargs) -> None:
    key_event_send(tier_id=instance.tier_id)  # the key rows carry their tier's per-model limits


def connect() -> None:
    """Hook every save and delete of an ApiKey, Tenant, Tier or a tier's per-model limit (AppConfig.ready)."""
    from django.db.models.signals import post_delete, post_save

    from tenants.models import ApiKey, Tenant, Tier, TierModelLimit

    for model, receiver in ((ApiKey, _on_api_key), (Tenant, _on_tenant), (Tier, _on_tier),
                            (TierModelLimit, _on_tier_model_limit)):
        for signal in (post_save, post_delete):
            signal.connect(receiver, sender=model, dispatch_uid=f"key_events:{model.__name__}")


# ---------------------------------------------------------------- receiving
def _deliver(event: dict) -> None:
    """Apply an event in this process (any thread): the cache, then the matching sockets."""
    api_key_cache_clear()
    for watch in _watches_matching(event):
        watch.notify()


def _received(data) -> None:
    try:
        event = json.loads(data)
        if not isinstance(event, dict):
            raise ValueError("not an object")
    except ValueError:
        logger.warning("key events: ignoring a malformed message %r", str(data)[:80])
        return
    if event.get("origin") == _ORIGIN:
        return  # delivered here at the commit
    _deliver({name: event.get(name) for name in ("prefix", "tenant_id", "tier_id")})


def key_events_listen_ensure() -> None:
    """Start this event loop's listener unless it runs (a no-op without REDIS_URL); cheap, call it often."""
    global _listener
    if not settings.REDIS_URL:
        return
    loop = asyncio.get_running_loop()
    if _listener is None or _listener.done() or _listener.get_loop() is not loop:
        _listener = loop.create_task(_listen(settings.REDIS_URL), name="key events: listener")


async def _listen(url: str) -> None:
    import redis.asyncio

    delay = RETRY_MIN_S
    lost = False  # a subscription was lost: events published meanwhile were missed
    while True:
        client = redis.asyncio.Redis.from_url(url, socket_timeout=PING_EVERY_S * 2, socket_connect_timeout=2)
        pubsub = client.pubsub()
        try:
            await pubsub.subscribe(channel_name(url))
            idle = 0.0
            while True:
                message = await pubsub.get_message(timeout=1.0)
                if asyncio.current_task().cancelling():
                    # a cancel that raced get_message's own timeout can come back as "no message"
                    raise asyncio.CancelledError
                if message is None:
                    idle += 1.0
                    if idle >= PING_EVERY_S:
                        idle = 0.0
                        await pubsub.ping()
                    continue
                idle = 0.0
                if message["type"] == "subscribe":
                    _listen_outage.ok()
                    delay = RETRY_MIN_S
                    _subscribed.set()
                    if lost:  # whatever was published while not subscribed is lost: start afresh
                        lost = False
                        _deliver({"all": True})
                elif message["type"] == "message":
                    _received(message["data"])
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - Redis errors, a reset socket: log once, retry
            _listen_outage.failed(exc)
            lost = True
        finally:
            _subscribed.clear()
            try:
                await asyncio.wait_for(_close(pubsub, client), 2)
            except Exception:  # noqa: BLE001 - the connection is gone already
                pass
        await asyncio.sleep(delay)
        delay = min(delay * 2, RETRY_MAX_S)


async def _close(pubsub, client) -> None:
    await pubsub.aclose()
    await client.aclose()


def key_events_listening() -> bool:
    return _subscribed.is_set()


# ---------------------------------------------------------------- watches (open sockets)
class KeyWatch:
    """One open authenticated socket: which key, tenant and tier it uses, and what to call when they change.

    `on_change` runs on the socket's event loop (events come from any thread), and at the key's expiry."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_change: Callable[[], None]) -> None:
        self.loop, self.on_change = loop, on_change
        self.prefix: str | None = None
        self.tenant_id: int | None = None
        self.tier_id: int | None = None
        self._expiry: asyncio.TimerHandle | None = None

    def matches(self, event: dict) -> bool:
        return bool(event.get("all")
                    or (event.get("prefix") is not None and event.get("prefix") == self.prefix)
                    or (event.get("tenant_id") is not None and event.get("tenant_id") == self.tenant_id)
                    or (event.get("tier_id") is not None and event.get("tier_id") == self.tier_id))

    def notify(self) -> None:
        try:
            self.loop.call_soon_threadsafe(self.on_change)
        except RuntimeError:  # the loop is closed: its socket is gone
            pass

    def _expiry_at(self, expires_at: datetime | None) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        if expires_at is not None:
            delay = max((expires_at - timezone.now()).total_seconds(), 0.0) + EXPIRY_SLACK_S
            self._expiry = self.loop.call_later(delay, self.on_change)


_watches: set[KeyWatch] = set()
_watches_lock = threading.Lock()


def _watches_matching(event: dict) -> list[KeyWatch]:
    with _watches_lock:
        return [watch for watch in _watches if watch.matches(event)]


def key_watch_start(*, context, on_change: Callable[[], None]) -> KeyWatch:
    """Watch an authenticated context (tenants.services.api_keys.AuthContext) from the running loop."""
    watch = KeyWatch(asyncio.get_running_loop(), on_change)
    key_watch_update(watch, context=context)
    with _watches_lock:
        _watches.add(watch)
    return watch


def key_watch_update(watch: KeyWatch, *, context) -> None:
    """After a re-check: the tenant's tier (or the key's expiry) may have changed. On the watch's loop."""
    with _watches_lock:
        watch.prefix, watch.tenant_id, watch.tier_id = context.api_key.prefix, context.tenant.pk, context.tier.pk
    watch._expiry_at(context.api_key.expires_at)


def key_watch_stop(watch: KeyWatch) -> None:
    with _watches_lock:
        _watches.discard(watch)
    watch._expiry_at(None)


def key_watch_count() -> int:
    with _watches_lock:
        return len(_watches)
