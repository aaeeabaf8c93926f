"""API keys: create, revoke, and verify the `Authorization: Bearer <key>` header.

Format: ``sk-<public id>-<secret>``, e.g. ``sk-3fq9x0k2mz-<43 base62 chars>``.
The public id (stored in ``ApiKey.prefix`` as ``sk-<id>``) names the row; the
secret (~256 bits from ``secrets``) is shown once and only its HMAC-SHA-256
under ``settings.API_KEY_PEPPER`` is stored. Verification looks the row up by
prefix and compares digests in constant time; an unknown prefix takes the same
steps (an HMAC compared against a dummy digest), so a 401 does not say which.
The async path used by the completion endpoints and the WebSocket keeps the
row, and the fact that a prefix is unknown, for ~2 s (`api_key_cache`): any
change to a key, tenant or tier empties that cache, in this process at once
and in the other web processes over Redis pub/sub (`key_events`), so a revoked
or expired key, or a suspended tenant, is refused on the very next request
(other web processes: within a second; the cache's TTL while Redis is away).

``last_used_at`` is written at most once per ``LAST_USED_RESOLUTION`` per key:
a request only issues an UPDATE when the loaded value is older than that, and
the UPDATE itself is conditional, so concurrent requests do not pile up writes.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import re
import secrets
import string
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from common.db import aretry_on_lost_connection
from common.errors import AuthenticationError, InvalidRequest, PermissionDenied
from tenants.models import ApiKey, Tenant, Tier
from tenants.selectors import KEY_ROW_MODEL_LIMITS
from tenants.services import api_key_cache
from tenants.services.api_key_cache import cached_key_get, cached_key_put, cached_unknown, cached_unknown_put
from tenants.services.key_events import key_event_send, key_events_listen_ensure
from tenants.services.limits import LIMIT_FIELDS, MAX_LINEAGE

KEY_SCHEME = "sk"
PUBLIC_ID_ALPHABET = string.ascii_lowercase + string.digits
PUBLIC_ID_LENGTH = 10
SECRET_ALPHABET = string.ascii_letters + string.digits
SECRET_LENGTH = 43  # 43 * log2(62) ~ 256 bits
LAST_USED_RESOLUTION = timedelta(seconds=60)
# Anything longer than a key plus a scheme is refused before any parsing work.
MAX_AUTHORIZATION_LENGTH = 256

_KEY_RE = re.compile(rf"{KEY_SCHEME}-([a-z0-9]{{{PUBLIC_ID_LENGTH}}})-([A-Za-z0-9]{{{SECRET_LENGTH}}})")
_AUTH_HEADER_HINT = "Authorization: Bearer YOUR_API_KEY"
_WWW_AUTHENTICATE = {"WWW-Authenticate": 'Bearer realm="api"'}
_DUMMY_DIGEST = "0" * 64  # what an unknown prefix's HMAC is compared with (never equal: same work, same answer)


@dataclass(frozen=True)
class AuthContext:
    """What an authenticated request carries (request.auth in DRF views)."""

    tenant: Tenant
    tier: Tier
    api_key: ApiKey


@dataclass(frozen=True)
class NewApiKey:
    api_key: ApiKey
    key: str  # the plaintext key; shown to the caller once, never stored


def _now() -> datetime:
    return timezone.now()


def _unauthorized(message: str) -> AuthenticationError:
    return AuthenticationError(message, headers=dict(_WWW_AUTHENTICATE))


# ---------------------------------------------------------------- hashing and format
def api_key_hash(*, secret: str) -> str:
    """HMAC-SHA-256 of the secret under the server-side pepper, hex."""
    return hmac.new(settings.API_KEY_PEPPER.encode(), secret.encode(), hashlib.sha256).hexdigest()


def api_key_parse(*, key: str) -> tuple[str, str] | None:
    """Split a key into (stored prefix, secret), or None if it is not one of ours."""
    match = _KEY_RE.fullmatch(key)
    if match is None:
        return None
    return f"{KEY_SCHEME}-{match.group(1)}", match.group(2)


def _generate_key() -> tuple[str, str]:
    public_id = "".join(secrets.choice(PUBLIC_ID_ALPHABET) for _ in range(PUBLIC_ID_LENGTH))
    secret = "".join(secrets.choice(SECRET_ALPHABET) for _ in range(SECRET_LENGTH))
    return f"{KEY_SCHEME}-{public_id}", secret


def bearer_token(*, authorization: str | None) -> str:
    """The token of an `Authorization: Bearer <token>` value; 401 for anything else."""
    if authorization is None or not authorization.strip():
        raise _unauthorized(
            "You didn't provide an API key. Provide it in an Authorization header using Bearer auth "
            f"({_AUTH_HEADER_HINT})."
        )
    if len(authorization) > MAX_AUTHORIZATION_LENGTH:
        raise _unauthorized(f"Malformed Authorization header. Expected {_AUTH_HEADER_HINT}.")
    parts = authorization.split()
    if len(parts) != 2 or parts[0].lower() != "bearer":
        raise _unauthorized(f"Malformed Authorization header. Expected {_AUTH_HEADER_HINT}.")
    return parts[1]


# ---------------------------------------------------------------- create / revoke
def _validated_scopes(scopes: list[str] | None) -> list[str]:
    scopes = list(scopes or [])
    unknown = [scope for scope in scopes if scope not in ApiKey.ALL_SCOPES]
    if unknown:
        raise InvalidRequest(
            f"Unknown scope {unknown[0]!r}; valid scopes: {', '.join(ApiKey.ALL_SCOPES)}.", param="scopes"
        )
    return sorted(set(scopes))


def api_key_create(
    *,
    tenant: Tenant,
    name: str,
    scopes: list[str] | None = None,
    expires_at: datetime | None = None,
    created_by=None,
    lineage: list[int] | None = None,
    **ceilings: int,
) -> NewApiKey:
    """Create a key; the plaintext is in the result and nowhere else. Empty scopes = all scopes.
    `ceilings`: the key's own limits (`limits.LIMIT_FIELDS`; none: only its tenant's)."""
    name = (name or "").strip()
    if not name:
        raise InvalidRequest("A key needs a name.", param="name")
    if not name.isprintable():
        raise InvalidRequest("The key name may not contain control characters.", param="name")
    if len(name) > ApiKey._meta.get_field("name").max_length:
        raise InvalidRequest("The key name is too long (at most 100 characters).", param="name")
    if expires_at is not None and expires_at <= _now():
        raise InvalidRequest("expires_at must be in the future.", param="expires_at")
    unknown = sorted(set(ceilings) - set(LIMIT_FIELDS))
    if unknown:
        raise ValueError(f"unknown limit {unknown[0]!r}")
    api_key = ApiKey(
        tenant=tenant, name=name, scopes=_validated_scopes(scopes), expires_at=expires_at, created_by=created_by,
        lineage=list(lineage or []), **ceilings,
    )
    return NewApiKey(api_key=api_key, key=api_key_issue(api_key=api_key))


def api_key_issue(*, api_key: ApiKey) -> str:
    """Draw key material for an unsaved ApiKey (tenant, name, scopes... set), save it, return the plaintext.

    The admin's add form uses this directly; everything else goes through api_key_create.
    """
    for _attempt in range(5):  # a prefix collision (~2^-51 per pair) just draws again
        prefix, secret = _generate_key()
        api_key.prefix, api_key.last_four, api_key.secret_hash = prefix, secret[-4:], api_key_hash(secret=secret)
        try:
            with transaction.atomic():
                api_key.save(force_insert=True)
        except IntegrityError:
            if ApiKey.objects.filter(prefix=prefix).exists():
                api_key.pk = None
                continue
            raise
        return f"{prefix}-{secret}"
    raise RuntimeError("could not draw a unique API key prefix")


def api_key_create_for(*, creator: ApiKey, name: str, scopes: list[str] | None = None,
                       expires_at: datetime | None = None) -> NewApiKey:
    """A key creating a key for its own tenant: never more scopes than the creator has, never a later
    expiry (none asked: the creator's), and the creator's own ceilings (rate, tokens, concurrency, quota,
    budget: `limits.LIMIT_FIELDS`) copied, so a limited or expiring key cannot mint an unlimited or
    lasting one (OpenAI's restricted keys). The new key's requests count against its creator's ceilings too
    (`ApiKey.lineage`, `limits.key_scopes`): N keys made by a limited key share its limits, not N times them."""
    creator_scopes = creator.scopes or list(ApiKey.ALL_SCOPES)
    requested = _validated_scopes(scopes) or list(creator_scopes)
    extra = [scope for scope in requested if scope not in creator_scopes]
    if extra:
        raise PermissionDenied(
            f"This key cannot grant the scope {extra[0]!r}, which it does not have itself.",
            param="scopes",
            code="insufficient_scope",
        )
    if sorted(requested) == sorted(ApiKey.ALL_SCOPES):
        requested = []  # store "all" the canonical way
    if creator.expires_at is not None:
        if expires_at is not None and expires_at > creator.expires_at:
            raise PermissionDenied("A key cannot create a key that expires after it does.", param="expires_at",
                                   code="expires_after_creator")
        expires_at = expires_at or creator.expires_at
    ceilings = {field: getattr(creator, field) for field in LIMIT_FIELDS if getattr(creator, field, None)}
    return api_key_create(tenant=creator.tenant, name=name, scopes=requested, expires_at=expires_at,
                          lineage=[creator.pk, *(creator.lineage or [])][:MAX_LINEAGE], **ceilings)


def api_key_revoke(*, api_key: ApiKey) -> ApiKey:
    """Revoke now (idempotent: a second call keeps the first revocation time)."""
    ApiKey.objects.filter(pk=api_key.pk, revoked_at__isnull=True).update(revoked_at=_now())
    key_event_send(prefix=api_key.prefix, tenant_id=api_key.tenant_id)  # a queryset update sends no post_save
    api_key.refresh_from_db(fields=["revoked_at"])
    return api_key


def api_key_require_scope(*, api_key: ApiKey, scope: str) -> None:
    if not api_key.has_scope(scope):
        raise PermissionDenied(
            f"This API key lacks the scope {scope!r}.", code="insufficient_scope"
        )


# ---------------------------------------------------------------- verify
# Relations that the verified-key rows carry besides tenant__tier, registered by the apps above tenants at
# start-up (billing: "tenant__budget", the tenant's budget row): what admission reads of a key's row then
# comes with it, in the same query, and tenants never names another app.
_row_relations: list[str] = []


def key_row_relation_add(path: str) -> None:
    """Have every verified-key row read `path` with it (select_related), from now on (an AppConfig.ready)."""
    if path not in _row_relations:
        _row_relations.append(path)
        api_key_cache.api_key_cache_clear()


def _lookup_queryset():
    return ApiKey.objects.select_related("tenant__tier", *_row_relations)


def _cached_row_queryset():
    """The rows the hot path caches also bring their tier's per-model limits (admission reads them from memory)."""
    return _lookup_queryset().prefetch_related(KEY_ROW_MODEL_LIMITS)


def _check(api_key: ApiKey | None, secret: str, now: datetime) -> AuthContext:
    """Constant-time secret check, then state checks (only for the key's holder)."""
    expected = api_key.secret_hash if api_key is not None else _DUMMY_DIGEST
    matches = hmac.compare_digest(api_key_hash(secret=secret), expected)
    if api_key is None or not matches:
        raise _unauthorized("Incorrect API key provided.")
    if api_key.revoked_at is not None:
        raise _unauthorized("This API key has been revoked.")
    if api_key.expires_at is not None and api_key.expires_at <= now:
        raise _unauthorized("This API key has expired.")
    tenant = api_key.tenant
    if not tenant.is_active:
        raise PermissionDenied(
            f"The tenant {tenant.slug!r} is suspended; contact the operator.", code="tenant_suspended"
        )
    return AuthContext(tenant=tenant, tier=tenant.tier, api_key=api_key)


def _parse_or_401(key: str) -> tuple[str, str]:
    parsed = api_key_parse(key=key)
    if parsed is None:
        raise _unauthorized("Malformed API key. Keys look like sk-xxxxxxxxxx-... (see /v1/keys).")
    return parsed


def _touch_filter(api_key: ApiKey, now: datetime):
    threshold = now - LAST_USED_RESOLUTION
    if api_key.last_used_at is not None and api_key.last_used_at >= threshold:
        return None
    return ApiKey.objects.filter(pk=api_key.pk).filter(Q(last_used_at__isnull=True) | Q(last_used_at__lt=threshold))


def api_key_verify(*, key: str) -> AuthContext:
    """The AuthContext for a plaintext key; AuthenticationError (401) / PermissionDenied (403)."""
    prefix, secret = _parse_or_401(key)
    now = _now()
    context = _check(_lookup_queryset().filter(prefix=prefix).first(), secret, now)
    pending = _touch_filter(context.api_key, now)
    if pending is not None:
        pending.update(last_used_at=now)
        context.api_key.last_used_at = now
    return context


_KEEP_WARM_BATCH = 500
_keeper: asyncio.Task | None = None  # the keep-warm task of this process's event loop (api_key_cache.rows)
_unknown_keeper: asyncio.Task | None = None  # and of api_key_cache.unknown


async def _reload_rows(prefixes: list[str]) -> dict[str, ApiKey]:
    """The rows of the keys in use, for the cache's keep-warm task: one query per batch."""
    rows = {}
    for start in range(0, len(prefixes), _KEEP_WARM_BATCH):  # SQLite caps the parameters of a query
        batch = prefixes[start:start + _KEEP_WARM_BATCH]
        rows.update({row.prefix: row async for row in _cached_row_queryset().filter(prefix__in=batch)})
    return rows


async def _reload_unknown(prefixes: list[str]) -> dict[str, bool]:
    """The prefixes still unknown, for the unknown cache's keep-warm task (a found one is forgotten)."""
    found = set()
    for start in range(0, len(prefixes), _KEEP_WARM_BATCH):
        batch = prefixes[start:start + _KEEP_WARM_BATCH]
        found.update([prefix async for prefix in ApiKey.objects.filter(prefix__in=batch).values_list("prefix", flat=True)])
    return {prefix: True for prefix in prefixes if prefix not in found}


def _keeper_ensure() -> None:
    global _keeper
    _keeper = api_key_cache.rows.keep_warm(_reload_rows, within_s=api_key_cache.keep_warm_s) or _keeper


def _unknown_keeper_ensure() -> None:
    global _unknown_keeper
    _unknown_keeper = (api_key_cache.unknown.keep_warm(_reload_unknown, within_s=api_key_cache.keep_warm_s)
                       or _unknown_keeper)


async def aapi_key_verify(*, key: str) -> AuthContext:
    """api_key_verify for the event loop, with the row cached briefly (see api_key_cache)."""
    prefix, secret = _parse_or_401(key)
    now = _now()
    key_events_listen_ensure()
    # both caches asked every time, so a known and an unknown prefix take the same steps from memory
    row, unknown = cached_key_get(prefix), cached_unknown(prefix)
    if row is None and not unknown:
        read_generation, unknown_generation = api_key_cache.generation(), api_key_cache.unknown_generation()
        row = await aretry_on_lost_connection(lambda: _cached_row_queryset().filter(prefix=prefix).afirst())
        if row is not None:
            cached_key_put(prefix, row, read_generation=read_generation)
            _keeper_ensure()
        else:
            cached_unknown_put(prefix, read_generation=unknown_generation)
            _unknown_keeper_ensure()
    context = _check(row, secret, now)
    pending = _touch_filter(context.api_key, now)
    if pending is not None:
        await pending.aupdate(last_used_at=now)
        context.api_key.last_used_at = now
    return context


def api_key_authenticate(*, authorization: str | None) -> AuthContext:
    """Authenticate an Authorization header value (contract section 5)."""
    return api_key_verify(key=bearer_token(authorization=authorization))


async def aapi_key_authenticate(*, authorization: str | None) -> AuthContext:
    return await aapi_key_verify(key=bearer_token(authorization=authorization))
