import hashlib
import hmac
import re
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from common.errors import AuthenticationError, InvalidRequest, PermissionDenied
from tenants.models import ApiKey, Tenant
from tenants.services import api_keys as svc
from tenants.services.api_keys import (
    LAST_USED_RESOLUTION,
    aapi_key_authenticate,
    api_key_authenticate,
    api_key_create,
    api_key_create_for,
    api_key_hash,
    api_key_parse,
    api_key_revoke,
    api_key_verify,
)

KEY_RE = re.compile(r"sk-[a-z0-9]{10}-[A-Za-z0-9]{43}")


def test_key_format_and_storage(api_key):
    key, row = api_key.key, api_key.api_key
    assert KEY_RE.fullmatch(key)
    prefix, secret = api_key_parse(key=key)
    assert prefix == row.prefix and key.startswith(prefix + "-")
    assert row.last_four == secret[-4:]
    expected = hmac.new(settings.API_KEY_PEPPER.encode(), secret.encode(), hashlib.sha256).hexdigest()
    assert row.secret_hash == expected == api_key_hash(secret=secret)
    assert row.secret_hash != hashlib.sha256(secret.encode()).hexdigest()
    row.refresh_from_db()
    assert key not in {row.prefix, row.secret_hash, row.last_four, row.name}


def test_keys_are_unique_and_high_entropy(api_key_factory, tenant):
    keys = [api_key_factory(tenant=tenant).key for _ in range(20)]
    assert len(set(keys)) == 20
    assert len({api_key_parse(key=k)[0] for k in keys}) == 20
    # 43 base62 characters: ~256 bits
    assert all(len(api_key_parse(key=k)[1]) == 43 for k in keys)


def test_pepper_matters(api_key, settings):
    assert api_key_verify(key=api_key.key).api_key.pk == api_key.api_key.pk
    settings.API_KEY_PEPPER = "another-pepper-" + "x" * 40
    with pytest.raises(AuthenticationError):
        api_key_verify(key=api_key.key)


def test_verify_returns_context(api_key, tenant):
    context = api_key_authenticate(authorization=f"Bearer {api_key.key}")
    assert context.tenant == tenant and context.tier == tenant.tier and context.api_key == api_key.api_key
    assert context.tenant.cache_salt == f"tenant:{tenant.pk}"
    assert isinstance(context.tier.priority, int)


def test_verify_is_one_query_when_recently_used(api_key):
    api_key_verify(key=api_key.key)  # first use writes last_used_at
    with CaptureQueriesContext(connection) as queries:
        api_key_verify(key=api_key.key)
    assert len(queries) == 1
    assert queries[0]["sql"].lstrip().upper().startswith("SELECT")


def test_last_used_written_at_most_once_per_resolution(api_key, monkeypatch):
    start = timezone.now()
    monkeypatch.setattr(svc, "_now", lambda: start)
    api_key_verify(key=api_key.key)
    row = ApiKey.objects.get(pk=api_key.api_key.pk)
    assert row.last_used_at == start

    later = start + LAST_USED_RESOLUTION - timedelta(seconds=1)
    monkeypatch.setattr(svc, "_now", lambda: later)
    with CaptureQueriesContext(connection) as queries:
        api_key_verify(key=api_key.key)
    assert not [q for q in queries if q["sql"].lstrip().upper().startswith("UPDATE")]
    assert ApiKey.objects.get(pk=row.pk).last_used_at == start

    much_later = start + LAST_USED_RESOLUTION + timedelta(seconds=1)
    monkeypatch.setattr(svc, "_now", lambda: much_later)
    api_key_verify(key=api_key.key)
    assert ApiKey.objects.get(pk=row.pk).last_used_at == much_later


def test_revoke_is_immediate_and_idempotent(api_key):
    api_key_verify(key=api_key.key)
    row = api_key_revoke(api_key=api_key.api_key)
    first = row.revoked_at
    assert first is not None
    with pytest.raises(AuthenticationError, match="revoked"):
        api_key_verify(key=api_key.key)
    assert api_key_revoke(api_key=ApiKey.objects.get(pk=row.pk)).revoked_at == first


def test_expiry_is_immediate(api_key_factory, monkeypatch):
    new = api_key_factory(expires_at=timezone.now() + timedelta(hours=1))
    api_key_verify(key=new.key)
    monkeypatch.setattr(svc, "_now", lambda: timezone.now() + timedelta(hours=1, seconds=1))
    with pytest.raises(AuthenticationError, match="expired"):
        api_key_verify(key=new.key)


def test_wrong_secret_and_unknown_prefix(api_key):
    prefix, secret = api_key_parse(key=api_key.key)
    flipped = secret[:-1] + ("A" if secret[-1] != "A" else "B")
    for bad in (f"{prefix}-{flipped}", "sk-zzzzzzzzzz-" + secret):
        with pytest.raises(AuthenticationError) as info:
            api_key_verify(key=bad)
        assert info.value.status_code == 401 and info.value.code == "invalid_api_key"
        assert info.value.headers["WWW-Authenticate"].startswith("Bearer")


def test_suspended_tenant_is_403(api_key, tenant):
    Tenant.objects.filter(pk=tenant.pk).update(status=Tenant.Status.SUSPENDED)
    with pytest.raises(PermissionDenied) as info:
        api_key_verify(key=api_key.key)
    assert info.value.status_code == 403 and info.value.code == "tenant_suspended"


@pytest.mark.parametrize(
    "header",
    [None, "", "   ", "Bearer", "Bearer ", "Basic dXNlcjpwYXNz", "Bearer a b", "sk-abc", "Bearer sk-",
     "Bearer sk-abcdefghij-", "Bearer " + "x" * 10_000, "Bearer sk-abcdefghij-\x00" + "a" * 42,
     "Bearer sk-ABCDEFGHIJ-" + "a" * 43, "Bearer sk-abcdefghij-" + "é" * 43, "Bearer \u2603"],
)
def test_malformed_headers_are_401(db, header):
    with pytest.raises(AuthenticationError) as info:
        api_key_authenticate(authorization=header)
    assert info.value.status_code == 401


def test_scheme_is_case_insensitive_and_spacing_tolerant(api_key):
    for header in (f"bearer {api_key.key}", f"BEARER   {api_key.key}", f"  Bearer {api_key.key}  "):
        assert api_key_authenticate(authorization=header).api_key.pk == api_key.api_key.pk


def test_create_validation(tenant):
    with pytest.raises(InvalidRequest) as info:
        api_key_create(tenant=tenant, name="  ")
    assert info.value.param == "name"
    with pytest.raises(InvalidRequest) as info:
        api_key_create(tenant=tenant, name="x", scopes=["root"])
    assert info.value.param == "scopes"
    with pytest.raises(InvalidRequest) as info:
        api_key_create(tenant=tenant, name="x", expires_at=timezone.now() - timedelta(seconds=1))
    assert info.value.param == "expires_at"


def test_created_keys_never_exceed_creator_scopes(api_key_factory, tenant):
    limited = api_key_factory(tenant=tenant, scopes=[ApiKey.SCOPE_KEYS, ApiKey.SCOPE_INFERENCE]).api_key
    child = api_key_create_for(creator=limited, name="child")
    assert sorted(child.api_key.scopes) == sorted([ApiKey.SCOPE_KEYS, ApiKey.SCOPE_INFERENCE])
    with pytest.raises(PermissionDenied):
        api_key_create_for(creator=limited, name="escalate", scopes=[ApiKey.SCOPE_USAGE])
    full = api_key_factory(tenant=tenant).api_key
    assert api_key_create_for(creator=full, name="all").api_key.scopes == []


@pytest.mark.django_db(transaction=True)
async def test_async_twin(api_key_factory):
    from asgiref.sync import sync_to_async
    from django.db import connections

    try:
        new = await sync_to_async(api_key_factory)()
        context = await aapi_key_authenticate(authorization=f"Bearer {new.key}")
        assert context.api_key.pk == new.api_key.pk
        assert context.tenant.slug == new.api_key.tenant.slug and context.tier.name
        assert context.api_key.last_used_at is not None
        with pytest.raises(AuthenticationError):
            await aapi_key_authenticate(authorization=None)
        await sync_to_async(api_key_revoke)(api_key=new.api_key)
        with pytest.raises(AuthenticationError, match="revoked"):
            await aapi_key_authenticate(authorization=f"Bearer {new.key}")
    finally:
        await sync_to_async(connections.close_all)()  # the ORM thread's connection, before the test DB is dropped
