"""A short-lived, per-process cache of API key rows for the inference hot path.

`aapi_key_verify` (the completion endpoints and the WebSocket) looked the key
row up in the database on every request: 1.7-2.5 ms of the gateway's
time-to-first-token at 16 streams on a 2-core VM (BENCHMARKS.md, serving),
mostly the hop to the database thread. A row found by its prefix is kept here
for ``settings.API_KEY_CACHE_TTL_S`` seconds (default 2; 0 turns the cache
off). What stays per request: the secret is still checked against the row's
digest in constant time, and expiry against the clock, on every request;
unknown prefixes are never cached.

Kept warm: every key used in the last ``settings.API_KEY_CACHE_KEEP_WARM_S``
seconds (default 30; 0 off) is reloaded, all in one query, every half TTL by a
task on the web process's event loop (`api_keys._keep_warm`), so a key in use
never waits for the database on the request path while its requests come
less than that far apart, and no row is ever served more than the TTL after
it was read. (At ~1 request/s a reload started by a request in the second half of
the TTL still left one request in ten to find its row expired: 3-7 ms of
database round trip on the 2-core VM, BENCHMARKS.md, serving.) A reload that
began before the cache was emptied is discarded (`generation`), so it cannot
bring back a row that a revocation in this process just dropped.

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
DEFAULT_KEEP_WARM_S = 30.0

# prefix -> (monotonic time of its last use, monotonic expiry, ApiKey with tenant__tier)
_entries: dict[str, tuple[float, float, object]] = {}
_generation = 0  # bumped by every clear


def ttl_s() -> float:
    return float(getattr(settings, "API_KEY_CACHE_TTL_S", DEFAULT_TTL_S))


def generation() -> int:
    """Take it before reading a row from the database; pass it to `cached_key_put`."""
    return _generation


def keep_warm_s() -> float:
    return float(getattr(settings, "API_KEY_CACHE_KEEP_WARM_S", DEFAULT_KEEP_WARM_S))


def cached_key_get(prefix: str):
    """The cached ApiKey row for `prefix`, or None (absent or expired); a hit counts as a use."""
    entry = _entries.get(prefix)
    if entry is None:
        return None
    now = time.monotonic()
    if entry[1] <= now:
        _entries.pop(prefix, None)
        return None
    _entries[prefix] = (now, entry[1], entry[2])
    return entry[2]


def in_use(within_s: float) -> list[str]:
    """Prefixes of the unexpired rows used in the last `within_s` seconds (the ones to keep warm)."""
    now = time.monotonic()
    return [prefix for prefix, (used, expires, _row) in list(_entries.items()) if expires > now and now - used <= within_s]


def cached_key_put(prefix: str, api_key, *, read_generation: int | None = None) -> None:
    """Cache a row read from the database for a request (dropped if the cache was emptied since
    `read_generation`)."""
    ttl = ttl_s()
    if ttl <= 0 or (read_generation is not None and read_generation != _generation):
        return
    now = time.monotonic()
    _entries[prefix] = (now, now + ttl, api_key)


def reload_done(prefix: str, api_key, *, read_generation: int) -> None:
    """A background reload's result: the fresh row (its last use unchanged), or None when the key is gone."""
    if read_generation != _generation:
        return
    entry = _entries.get(prefix)
    if api_key is None or entry is None:
        _entries.pop(prefix, None)
        return
    now = time.monotonic()
    _entries[prefix] = (entry[0], now + ttl_s(), api_key)


def api_key_cache_clear(**_signal_kwargs) -> None:
    """Forget every cached row (connected to post_save/post_delete of ApiKey, Tenant and Tier)."""
    global _generation
    _generation += 1
    _entries.clear()


def connect_signals() -> None:
    from django.db.models.signals import post_delete, post_save

    from tenants.models import ApiKey, Tenant, Tier

    for model in (ApiKey, Tenant, Tier):
        for signal in (post_save, post_delete):
            signal.connect(api_key_cache_clear, sender=model, dispatch_uid=f"api_key_cache_clear:{model.__name__}")
