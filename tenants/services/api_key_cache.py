"""A short-lived, per-process cache of API key rows for the inference hot path.

`aapi_key_verify` (the completion endpoints and the WebSocket) looked the key
row up in the database on every request: 1.7-2.5 ms of the gateway's
time-to-first-token at 16 streams on a 2-core VM (BENCHMARKS.md, serving),
mostly the hop to the database thread. A row found by its prefix is kept here
for ``settings.API_KEY_CACHE_TTL_S`` seconds (default 2; 0 turns the cache
off). What stays per request: the secret is still checked against the row's
digest in constant time, and expiry against the clock, on every request;
unknown prefixes are never cached.

Refresh ahead: a row read again in the second half of its TTL is reloaded in
the background (`refresh_due`), so a key in steady use never waits for the
database on the request path, while no row is ever served more than the TTL
after it was read. A reload that began before the cache was emptied is
discarded (`generation`), so it cannot bring back a row that a revocation
in this process just dropped.

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

# prefix -> (monotonic time a reload is due, monotonic expiry, ApiKey with tenant__tier)
_entries: dict[str, tuple[float, float, object]] = {}
_refreshing: set[str] = set()  # prefixes being reloaded in the background
_generation = 0  # bumped by every clear


def ttl_s() -> float:
    return float(getattr(settings, "API_KEY_CACHE_TTL_S", DEFAULT_TTL_S))


def generation() -> int:
    """Take it before reading a row from the database; pass it to `cached_key_put`."""
    return _generation


def cached_key_get(prefix: str):
    """The cached ApiKey row for `prefix`, or None (absent or expired)."""
    entry = _entries.get(prefix)
    if entry is None:
        return None
    if entry[1] <= time.monotonic():
        _entries.pop(prefix, None)
        return None
    return entry[2]


def refresh_due(prefix: str) -> bool:
    """True once per reload: the row is in the second half of its TTL and nobody reloads it yet."""
    entry = _entries.get(prefix)
    if entry is None or prefix in _refreshing or entry[0] > time.monotonic():
        return False
    _refreshing.add(prefix)
    return True


def cached_key_put(prefix: str, api_key, *, read_generation: int | None = None) -> None:
    """Cache a row read from the database (dropped if the cache was emptied since `read_generation`)."""
    ttl = ttl_s()
    if ttl <= 0 or (read_generation is not None and read_generation != _generation):
        return
    now = time.monotonic()
    _entries[prefix] = (now + ttl / 2, now + ttl, api_key)


def reload_done(prefix: str, api_key, *, read_generation: int) -> None:
    """A background reload's result: the fresh row, or None when the key is gone."""
    _refreshing.discard(prefix)
    if api_key is None:
        if read_generation == _generation:
            _entries.pop(prefix, None)
        return
    cached_key_put(prefix, api_key, read_generation=read_generation)


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
