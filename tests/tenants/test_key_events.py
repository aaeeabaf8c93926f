"""Key changes reaching every web process (tenants.services.key_events), and the unknown-prefix cache.

The Redis cases run a real listener on this test's event loop against the real
server (QUEUE_TEST_REDIS_URL's database; a private redis-server for the outage);
"another process" is a message published with another origin, as a web process
would publish it. The two-process case with real servers is
tests/inference/test_realtime_authz.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.db import connections
from django.utils import timezone

from common.errors import AuthenticationError, PermissionDenied
from tenants.models import ApiKey
from tenants.services import api_key_cache, key_events
from tenants.services import api_keys as svc
from tenants.services.api_keys import aapi_key_verify, api_key_create_for, api_key_parse, api_key_revoke
from tests.inference.queue_helpers import REDIS_TEST_URL, require_redis

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
async def new_key(api_key_factory):
    try:
        yield await sync_to_async(api_key_factory)()
    finally:
        await sync_to_async(connections.close_all)()


@pytest.fixture
async def listening(settings):
    """This loop's listener on the test Redis, stopped after the test."""
    require_redis()
    settings.REDIS_URL = REDIS_TEST_URL
    yield
    listener = key_events._listener
    if listener is not None and not listener.done():
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listener


async def _until(predicate, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)


def _watch(context) -> tuple[key_events.KeyWatch, asyncio.Event]:
    changed = asyncio.Event()
    return key_events.key_watch_start(context=context, on_change=changed.set), changed


def _publish_from_elsewhere(url: str, **event) -> None:
    import redis

    redis.Redis.from_url(url).publish(key_events.channel_name(url), json.dumps({**event, "origin": "another-process"}))


# ---------------------------------------------------------------- unknown prefixes (finding 4)
async def test_an_unknown_prefix_is_answered_from_memory_like_a_known_one(new_key, monkeypatch):
    """A known prefix with a wrong secret and an unknown prefix: the same 401, and after the first lookup
    neither reads the database (it was: found rows were cached, unknown prefixes never)."""
    prefix, secret = api_key_parse(key=new_key.key)
    wrong_secret = f"{prefix}-{'A' * len(secret)}"
    unknown = f"sk-zzzzzzzzzz-{'A' * len(secret)}"
    messages = []
    for key in (wrong_secret, unknown):  # the first lookups read the database
        with pytest.raises(AuthenticationError) as caught:
            await aapi_key_verify(key=key)
        messages.append(caught.value.message)
    assert messages[0] == messages[1] == "Incorrect API key provided."

    def no_lookup():
        raise AssertionError("answered from memory, both")

    monkeypatch.setattr(svc, "_lookup_queryset", no_lookup)
    for key in (wrong_secret, unknown):
        with pytest.raises(AuthenticationError, match="Incorrect API key"):
            await aapi_key_verify(key=key)


async def test_a_key_created_with_a_prefix_known_unknown_works_at_once(api_key_factory, tenant, monkeypatch):
    """A creation empties the unknown cache (here at once; elsewhere over pub/sub, below)."""
    secret = "B" * svc.SECRET_LENGTH
    with pytest.raises(AuthenticationError):
        await aapi_key_verify(key=f"sk-newprefix0-{secret}")
    assert api_key_cache.cached_unknown("sk-newprefix0")
    monkeypatch.setattr(svc, "_generate_key", lambda: ("sk-newprefix0", secret))
    try:
        created = await sync_to_async(api_key_factory)(tenant=tenant)
        assert created.key == f"sk-newprefix0-{secret}"
        context = await aapi_key_verify(key=created.key)
        assert context.api_key.pk == created.api_key.pk
    finally:
        await sync_to_async(connections.close_all)()


async def test_the_unknown_cache_is_bounded(db):
    cache = api_key_cache.unknown
    assert cache.max_entries <= 65_536
    for index in range(cache.max_entries + 5):
        api_key_cache.cached_unknown_put(f"sk-{index:010d}", read_generation=api_key_cache.unknown_generation())
    assert len(cache) <= cache.max_entries


# ---------------------------------------------------------------- watches (this process)
async def test_a_revocation_here_tells_the_watching_socket(new_key):
    context = await aapi_key_verify(key=new_key.key)
    watch, changed = _watch(context)
    try:
        await sync_to_async(api_key_revoke)(api_key=new_key.api_key)  # a queryset update: no post_save
        await asyncio.wait_for(changed.wait(), 5)
        with pytest.raises(AuthenticationError, match="revoked"):
            await aapi_key_verify(key=new_key.key)  # the cache was emptied too
    finally:
        key_events.key_watch_stop(watch)


async def test_a_suspension_or_tier_change_tells_the_tenants_sockets_only(new_key, api_key_factory, tier_factory):
    from tenants.services.tenants import tenant_change_tier, tenant_suspend

    other = await sync_to_async(api_key_factory)()  # another tenant
    watch, changed = _watch(await aapi_key_verify(key=new_key.key))
    other_watch, other_changed = _watch(await aapi_key_verify(key=other.key))
    try:
        tenant = await sync_to_async(lambda: new_key.api_key.tenant)()
        await sync_to_async(tenant_change_tier)(tenant=tenant, tier=await sync_to_async(tier_factory)())
        await asyncio.wait_for(changed.wait(), 5)
        changed.clear()
        await sync_to_async(tenant_suspend)(tenant=tenant)
        await asyncio.wait_for(changed.wait(), 5)
        with pytest.raises(PermissionDenied):
            await aapi_key_verify(key=new_key.key)
        await asyncio.sleep(0.1)
        assert not other_changed.is_set()
    finally:
        key_events.key_watch_stop(watch)
        key_events.key_watch_stop(other_watch)


async def test_a_watch_rechecks_at_the_keys_expiry(new_key):
    expires = timezone.now() + timedelta(seconds=0.5)
    await sync_to_async(ApiKey.objects.filter(pk=new_key.api_key.pk).update)(expires_at=expires)
    watch, changed = _watch(await aapi_key_verify(key=new_key.key))
    try:
        await asyncio.wait_for(changed.wait(), 5)
        assert timezone.now() >= expires
        with pytest.raises(AuthenticationError, match="expired"):
            await aapi_key_verify(key=new_key.key)
    finally:
        key_events.key_watch_stop(watch)
    assert key_events.key_watch_count() == 0


# ---------------------------------------------------------------- other processes, over Redis pub/sub
async def test_an_event_from_another_process_empties_the_cache_and_tells_the_socket(new_key, listening):
    await aapi_key_verify(key=new_key.key)  # starts the listener
    await _until(key_events.key_events_listening)  # subscribed: from now on no event is missed
    context = await aapi_key_verify(key=new_key.key)
    prefix, _ = api_key_parse(key=new_key.key)
    assert api_key_cache.cached_key_get(prefix) is not None
    watch, changed = _watch(context)
    try:
        # the row changed behind this process's back (as another process would change it), then its event
        await sync_to_async(ApiKey.objects.filter(pk=new_key.api_key.pk).update)(revoked_at=timezone.now())
        await asyncio.to_thread(_publish_from_elsewhere, REDIS_TEST_URL, prefix=prefix, tenant_id=None,
                                tier_id=None)
        await asyncio.wait_for(changed.wait(), 5)
        with pytest.raises(AuthenticationError, match="revoked"):
            await aapi_key_verify(key=new_key.key)
    finally:
        key_events.key_watch_stop(watch)


async def test_a_change_here_is_published_for_the_others(new_key, listening):
    """What this process sends: one message per committed change, naming the key (its own copy is skipped)."""
    import redis.asyncio

    await aapi_key_verify(key=new_key.key)
    await _until(key_events.key_events_listening)
    client = redis.asyncio.Redis.from_url(REDIS_TEST_URL)
    pubsub = client.pubsub()
    try:
        await pubsub.subscribe(key_events.channel_name(REDIS_TEST_URL))
        assert (await pubsub.get_message(timeout=5))["type"] == "subscribe"
        await sync_to_async(api_key_revoke)(api_key=new_key.api_key)
        message = None
        while message is None or message["type"] != "message":
            message = await pubsub.get_message(timeout=5)
            assert message is not None
        event = json.loads(message["data"])
        assert event["prefix"] == new_key.api_key.prefix and event["tenant_id"] == new_key.api_key.tenant_id
        assert event["origin"] == key_events._ORIGIN  # the others skip nothing; this process skips it
    finally:
        await pubsub.aclose()
        await client.aclose()


async def test_the_listener_survives_a_redis_outage(new_key, settings, tmp_path, caplog):
    """Redis stops: logged once, retried; Redis is back: resubscribed, every socket re-checked, and later
    events arrive again. Meanwhile the cache's TTL bounds staleness."""
    from tests.e2e.servers import PrivateRedis

    require_redis()
    server = PrivateRedis(tmp_path / "redis")
    server.start()
    settings.REDIS_URL = server.url
    try:
        context = await aapi_key_verify(key=new_key.key)
        await _until(key_events.key_events_listening)
        watch, changed = _watch(context)
        try:
            with caplog.at_level(logging.WARNING, logger="tenants.services.key_events"):
                await asyncio.to_thread(server.stop)
                await _until(lambda: not key_events.key_events_listening())
                await asyncio.sleep(3 * key_events.RETRY_MAX_S)  # several failed retries
                changed.clear()
                await asyncio.to_thread(server.start)
                await _until(key_events.key_events_listening, timeout=15)
            await asyncio.wait_for(changed.wait(), 5)  # re-checked on subscribing again
            outage_lines = [r for r in caplog.records if "unavailable" in r.getMessage()]
            assert len(outage_lines) == 1, [r.getMessage() for r in caplog.records]
            assert any("back after" in r.getMessage() for r in caplog.records)
            changed.clear()
            prefix, _ = api_key_parse(key=new_key.key)
            await asyncio.to_thread(_publish_from_elsewhere, server.url, prefix=prefix)
            await asyncio.wait_for(changed.wait(), 5)
        finally:
            key_events.key_watch_stop(watch)
    finally:
        listener = key_events._listener
        if listener is not None:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener
        await asyncio.to_thread(server.stop)


# ---------------------------------------------------------------- a key's children (finding 3)
def _limited(api_key_factory, tenant, **ceilings):
    from tenants.services.limits import limits_set

    creator = api_key_factory(tenant=tenant).api_key
    limits_set(tenant=tenant, api_key=creator, values=ceilings)
    creator.refresh_from_db()
    return creator


@pytest.mark.django_db
def test_a_child_key_gets_its_creators_ceilings(api_key_factory, tenant):
    creator = _limited(api_key_factory, tenant, requests_per_minute=2, max_concurrent_requests=1,
                       tokens_per_minute=500, monthly_token_quota=10_000, monthly_spend_limit_micros=5_000_000)
    child = api_key_create_for(creator=creator, name="child").api_key
    child.refresh_from_db()
    from tenants.services.limits import LIMIT_FIELDS, key_limits

    assert {f: getattr(child, f) for f in LIMIT_FIELDS} == {f: getattr(creator, f) for f in LIMIT_FIELDS}
    assert key_limits(api_key=child).requests_per_minute == 2
    unlimited = api_key_factory(tenant=tenant).api_key
    assert key_limits(api_key=api_key_create_for(creator=unlimited, name="free").api_key) is None


@pytest.mark.django_db
def test_a_child_key_counts_on_its_creators_ceilings_too(api_key_factory, tenant):
    from tenants.services.limits import LimitScope, key_scopes

    creator = _limited(api_key_factory, tenant, requests_per_minute=2, monthly_token_quota=10_000)
    child = api_key_create_for(creator=creator, name="child").api_key
    grandchild = api_key_create_for(creator=child, name="grandchild").api_key
    assert [scope.scope for scope in key_scopes(api_key=creator)] == [LimitScope.key(creator.pk)]
    assert [scope.scope for scope in key_scopes(api_key=grandchild)] == [
        LimitScope.key(grandchild.pk), LimitScope.key(child.pk), LimitScope.key(creator.pk)]
    assert all(scope.requests_per_minute == 2 and scope.monthly_token_quota == 10_000
               for scope in key_scopes(api_key=grandchild))
    unlimited = api_key_factory(tenant=tenant).api_key
    assert key_scopes(api_key=api_key_create_for(creator=unlimited, name="free").api_key) == []


@pytest.mark.django_db
def test_a_child_key_never_outlives_its_creator(api_key_factory, tenant):
    soon = timezone.now() + timedelta(days=1)
    creator = api_key_factory(tenant=tenant, expires_at=soon).api_key
    assert api_key_create_for(creator=creator, name="same").api_key.expires_at == soon
    earlier = soon - timedelta(hours=1)
    assert api_key_create_for(creator=creator, name="earlier", expires_at=earlier).api_key.expires_at == earlier
    with pytest.raises(PermissionDenied) as caught:
        api_key_create_for(creator=creator, name="later", expires_at=soon + timedelta(days=1))
    assert caught.value.param == "expires_at"
