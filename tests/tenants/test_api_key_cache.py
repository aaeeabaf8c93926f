"""The verified-key cache of the async (completion endpoints') path: fewer queries, same refusals."""

import asyncio
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.db import connections
from django.utils import timezone

from inference.errors import AuthenticationError, PermissionDenied
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


async def _reloads_finish() -> None:
    while svc._reloads:
        await asyncio.gather(*list(svc._reloads))


async def test_a_key_in_steady_use_is_reloaded_ahead_and_never_waits_for_the_database(new_key, settings):
    """In the second half of its TTL a hit starts one background reload; a revocation made elsewhere
    (no signal here) is seen after it, and the request that started it did not wait for it."""
    settings.API_KEY_CACHE_TTL_S = 0.4
    prefix, _ = api_key_parse(key=new_key.key)
    await aapi_key_authenticate(authorization=_bearer(new_key.key))
    first_row = cached_key_get(prefix)
    await aapi_key_authenticate(authorization=_bearer(new_key.key))  # first half: no reload
    assert not svc._reloads
    await sync_to_async(ApiKey.objects.filter(pk=new_key.api_key.pk).update)(revoked_at=timezone.now())
    await asyncio.sleep(0.25)
    await aapi_key_authenticate(authorization=_bearer(new_key.key))  # served from the cache, reload started
    assert len(svc._reloads) == 1
    await aapi_key_authenticate(authorization=_bearer(new_key.key))  # one reload at a time
    assert len(svc._reloads) == 1
    await _reloads_finish()
    assert cached_key_get(prefix) is not first_row
    with pytest.raises(AuthenticationError, match="revoked"):
        await aapi_key_authenticate(authorization=_bearer(new_key.key))


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
    api_key_cache.reload_done(prefix, row, read_generation=api_key_cache.generation())
    assert cached_key_get(prefix) is row


async def test_a_reload_that_finds_no_row_forgets_the_key(new_key, settings):
    """A key deleted elsewhere: the background reload finds nothing, and the next request reads again."""
    from tenants.services import api_key_cache

    settings.API_KEY_CACHE_TTL_S = 10
    prefix, _ = api_key_parse(key=new_key.key)
    await aapi_key_authenticate(authorization=_bearer(new_key.key))
    api_key_cache.reload_done(prefix, None, read_generation=api_key_cache.generation())
    assert cached_key_get(prefix) is None
