"""A short-lived, per-process cache of API key rows for the inference hot path.

`aapi_key_verify` (the completion endpoints and the WebSocket) looked the key
row up in the database on every request: 1.7-2.5 ms of the gateway's
time-to-first-token at 16 streams on a 2-core VM (BENCHMARKS.md, serving),
mostly the hop to the database thread. A row found by its prefix is kept here
for ``settings.API_KEY_CACHE_TTL_S`` seconds (default 2; 0 turns the cache
off). What stays per request: the secret is still checked against the row's
digest in constant time, and expiry against the clock, on every request;
unknown prefixes are never cached.

Freshness: any save or delete of an ApiKey, Tenant or Tier in this process
(revoking through `api_key_revoke`, the admin's suspend/change-tier actions,
the keys API) empties the cache at once, so in one process a revoked key or a
suspended tenant is refused on the very next request, as before. Other web
processes notice within the TTL. (LiteLLM's proxy caches verified keys for 60 s
by default; the window here is kept short on purpose.)
"""

from __future__ import annotations

import time

from django.conf import settings

DEFAULT_TTL_S = 2.0

_entries: dict[str, tuple[float, object]] = {}  # prefix -> (monotonic expiry, ApiKey with tenant__tier)


def ttl_s() -> float:
    return float(getattr(settings, "API_KEY_CACHE_TTL_S", DEFAULT_TTL_S))


def cached_key_get(prefix: str):
    """The cached ApiKey row for `prefix`, or None (absent or expired)."""
    entry = _entries.get(prefix)
    if entry is None:
        return None
    if entry[0] <= time.monotonic():
        _entries.pop(prefix, None)
        return None
    return entry[1]


def cached_key_put(prefix: str, api_key) -> None:
    ttl = ttl_s()
    if ttl > 0:
        _entries[prefix] = (time.monotonic() + ttl, api_key)


def api_key_cache_clear(**_signal_kwargs) -> None:
    """Forget every cached row (connected to post_save/post_delete of ApiKey, Tenant and Tier)."""
    _entries.clear()


def connect_signals() -> None:
    from django.db.models.signals import post_delete, post_save

    from tenants.models import ApiKey, Tenant, Tier

    for model in (ApiKey, Tenant, Tier):
        for signal in (post_save, post_delete):
            signal.connect(api_key_cache_clear, sender=model, dispatch_uid=f"api_key_cache_clear:{model.__name__}")
