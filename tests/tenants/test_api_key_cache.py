"""The verified-key cache of the async (completion endpoints') path: fewer queries, same refusals."""

import asyncio
import contextlib
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.db import connections
from django.utils import timezone

from common.errors import AuthenticationError, PermissionDenied
from tenants.models import ApiKey
from tenants.services import api_keys as svc
from tenants.services.api_key_cache import cached_key_get
from tenants.services.api_keys import aapi_key_authenticate, api_key_parse, api_key_revoke
from tenants.services.tenants import tenant_change_tier, tenant_suspend

pytestmark = pytest.mark.django_db(transaction=True)


def _bearer(key: str) -> str:
    return f"Bearer {key}"


@pytest.fixture
async def new_key(api_key_factory):
    try:
        yield await sync_to_async(api_key_factory)()
    finally:
        await sync_to_async(connections.close_all)()


async def test_second_request_needs_no_query(new_key, monkeypatch):
    await aapi_key_authenticate(authorization=_bearer(new_key.key))  # loads and caches the row
    prefix, _ = api_key_parse(key=new_key.key)
    assert cached_key_get(prefix) is not None

    def no_lookup():
        raise AssertionError("the cached row should have been used")

    monkeypatch.setattr(svc, "_lookup_queryset", no_lookup)
    context = await aapi_key_authenticate(authorization=_bearer(new_key.key))
    assert context.api_key.pk == new_key.api_key.pk and context.tier.name


async def test_cached_row_still_checks_the_secret(new_key):
    await aapi_key_authenticate(authorization=_bearer(new_key.key))
    prefix, secret = api_key_parse(key=new_key.key)
    wrong = f"{prefix}-{'A' * len(secret)}"
    with pytest.raises(AuthenticationError, match="Incorrect API key"):
        await aapi_key_authenticate(authorization=_bearer(wrong))


async def test_revoke_suspend_and_tier_changes_apply_on_the_next_request(new_key, tier_factory):
    row = new_key.api_key
    await aapi_key_authenticate(authorization=_bearer(new_key.key))
    other_tier = await sync_to_async(tier_factory)()
    tenant = await sync_to_async(lambda: row.tenant)()
    await sync_to_async(tenant_change_tier)(tenant=tenant, tier=other_tier)
    context = await aapi_key_authenticate(authorization=_bearer(new_key.key))
    assert context.tier.pk == other_tier.pk  # the save emptied the cache
    await sync_to_async(tenant_suspend)(tenant=tenant)
    with pytest.raises(PermissionDenied):
        await aapi_key_authenticate(authorization=_bearer(new_key.key))


async def test_revoke_applies_on_the_next_request(new_key):
    await aapi_key_authenticate(authorization=_bearer(new_key.key))
    await sync_to_async(api_key_revoke)(api_key=new_key.api_key)  # a queryset update: cleared explicitly
    with pytest.raises(AuthenticationError, match="revoked"):
        await aapi_key_authenticate(authorization=_bearer(new_key.key))


async def test_expiry_is_checked_on_every_request(new_key, monkeypatch):
    expires = timezone.now() + timedelta(minutes=5)
    await sync_to_async(ApiKey.objects.filter(pk=new_key.api_key.pk).update)(expires_at=expires)
    await aapi_key_authenticate(authorization=_bearer(new_key.key))
    monkeypatch.setattr(svc, "_now", lambda: expires + timedelta(seconds=1))
    with pytest.raises(AuthenticationError, match="expired"):
        await aapi_key_authenticate(authorization=_bearer(new_key.key))


async def test_changes_made_elsewhere_show_within_the_ttl(new_key, settings):
    """Another process's revocation sends no signal here: the row is reloaded once its TTL ran out."""
    settings.API_KEY_CACHE_TTL_S = 0.2
    await aapi_key_authenticate(authorization=_bearer(new_key.key))
    await sync_to_async(ApiKey.objects.filter(pk=new_key.api_key.pk).update)(revoked_at=timezone.now())
    await aapi_key_authenticate(authorization=_bearer(new_key.key))  # still cached: the documented window
    await asyncio.sleep(0.25)
    with pytest.raises(AuthenticationError, match="revoked"):
        await aapi_key_authenticate(authorization=_bearer(new_key.key))


async def test_ttl_zero_turns_the_cache_off(new_key, settings):
    settings.API_KEY_CACHE_TTL_S = 0
    await aapi_key_authenticate(authorization=_bearer(new_key.key))
    prefix, _ = api_key_parse(key=new_key.key)
    assert cached_key_get(prefix) is None


@pytest.fixture
async def keep_warm(settings):
    """The keep-warm task on (tests/conftest.py turns it off elsewhere), stopped after the test."""
    settings.API_KEY_CACHE_KEEP_WARM_S = 5
    yield
    keeper = svc._keeper
    if keeper is not None and not keeper.done():
        keeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await keeper


async def test_keys_in_use_are_reloaded_ahead_so_none_expires_while_used(new_key, api_key_factory, settings, keep_warm):
    """Every half TTL the keys used lately are reloaded (one query): a revocation made elsewhere (no
    signal here) shows within the TTL, and a key whose requests come further apart than the TTL
    still never waits for the database."""
    settings.API_KEY_CACHE_TTL_S = 0.4
    other = await sync_to_async(api_key_factory)()
    prefix, _ = api_key_parse(key=new_key.key)
    other_prefix, _ = api_key_parse(key=other.key)
    await aapi_key_authenticate(authorization=_bearer(new_key.key))  # read, cached; the keeper starts
    await aapi_key_authenticate(authorization=_bearer(other.key))
    keeper = svc._keeper
    assert keeper is not None and not keeper.done()
    first_row = cached_key_get(prefix)
    await sync_to_async(ApiKey.objects.filter(pk=new_key.api_key.pk).update)(revoked_at=timezone.now())
    await asyncio.sleep(0.7)  # past the TTL of the first read, without a request: reloaded meanwhile
    assert svc._keeper is keeper

    def no_lookup():
        raise AssertionError("a key in use should not be read on the request path")

    real_lookup = svc._lookup_queryset
    svc._lookup_queryset = no_lookup
    try:
        with pytest.raises(AuthenticationError, match="revoked"):  # the reloaded row, from the cache
            await aapi_key_authenticate(authorization=_bearer(new_key.key))
        context = await aapi_key_authenticate(authorization=_bearer(other.key))
    finally:
        svc._lookup_queryset = real_lookup
    assert context.api_key.pk == other.api_key.pk
    assert cached_key_get(prefix) is not first_row


async def test_the_keeper_stops_once_no_key_is_in_use(new_key, settings, keep_warm):
    settings.API_KEY_CACHE_TTL_S = 0.2
    settings.API_KEY_CACHE_KEEP_WARM_S = 0.15
    await aapi_key_authenticate(authorization=_bearer(new_key.key))
    keeper = svc._keeper
    await asyncio.wait_for(keeper, 2)  # ends by itself
    prefix, _ = api_key_parse(key=new_key.key)
    await asyncio.sleep(0.25)
    assert cached_key_get(prefix) is None  # no longer kept: expired at its TTL
    await aapi_key_authenticate(authorization=_bearer(new_key.key))  # the next read starts a new one
    assert svc._keeper is not keeper and not svc._keeper.done()


async def test_a_reload_that_raced_a_clear_is_dropped(new_key, settings):
    """A row read before this process emptied the cache (e.g. revoked it) must not come back."""
    from tenants.services import api_key_cache

    settings.API_KEY_CACHE_TTL_S = 10
    prefix, _ = api_key_parse(key=new_key.key)
    await aapi_key_authenticate(authorization=_bearer(new_key.key))
    row = cached_key_get(prefix)
    read_generation = api_key_cache.generation()  # a reload reads the row now...
    api_key_cache.api_key_cache_clear()  # ...the key is revoked in this process meanwhile...
    api_key_cache.reload_done(prefix, row, read_generation=read_generation)  # ...and the old row arrives
    assert cached_key_get(prefix) is None
    api_key_cache.cached_key_put(prefix, row, read_generation=read_generation)
    assert cached_key_get(prefix) is None
    api_key_cache.cached_key_put(prefix, row, read_generation=api_key_cache.generation())  # a request reads it
    fresh = object()
    api_key_cache.reload_done(prefix, fresh, read_generation=api_key_cache.generation())
    assert cached_key_get(prefix) is fresh


async def test_a_reload_that_finds_no_row_forgets_the_key(new_key, settings):
    """A key deleted elsewhere: the background reload finds nothing, and the next request reads again."""
    from tenants.services import api_key_cache

    settings.API_KEY_CACHE_TTL_S = 10
    prefix, _ = api_key_parse(key=new_key.key)
    await aapi_key_authenticate(authorization=_bearer(new_key.key))
    api_key_cache.reload_done(prefix, None, read_generation=api_key_cache.generation())
    assert cached_key_get(prefix) is None
