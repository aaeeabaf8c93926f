"""A short-lived, per-process cache of API key rows for the inference hot path.

`aapi_key_verify` (the completion endpoints and the WebSocket) would otherwise
look the key row up in the database on every request, through a hop to the
database thread, on the way to the first token. A row found by its prefix is
kept here (a `common.cache.TtlCache`) for ``settings.API_KEY_CACHE_TTL_S``
seconds (default 2; 0 turns the cache off). What stays per request: the secret is still checked against the row's
digest in constant time, and expiry against the clock, on every request;
unknown prefixes are never cached.

Kept warm: every key used in the last ``settings.API_KEY_CACHE_KEEP_WARM_S``
seconds (default 30; 0 off) is reloaded, all in one query, every half TTL by a
task on the web process's event loop (`TtlCache.keep_warm`, reading through
`api_keys._reload_rows`), so a key in use never waits for the database on the
request path while its requests come less than that far apart, and no row is
ever served more than the TTL after it was read. (A reload started by a
request instead, in the second half of the TTL, still left a steady client's
requests finding their row expired now and then.) A reload that began before
the cache was emptied is discarded (`generation`), so it cannot bring back a
row that a revocation in this process just dropped.

Freshness: any save or delete of an ApiKey, Tenant or Tier in this process
(revoking through `api_key_revoke`, the admin's suspend/change-tier actions,
the keys API) empties the cache at once, so in one process a revoked key or a
suspended tenant is refused on the very next request, as before. Other web
processes notice within the TTL. (LiteLLM's proxy caches verified keys for 60 s
by default; the window here is kept short on purpose.)
"""

from __future__ import annotations

from django.conf import settings

from common.cache import TtlCache


def ttl_s() -> float:  # read per call: settings changed at run time (and in tests) apply to the next entry
    return float(settings.API_KEY_CACHE_TTL_S)


def keep_warm_s() -> float:
    return float(settings.API_KEY_CACHE_KEEP_WARM_S)


# prefix -> ApiKey with tenant__tier; prefixes come from well-formed keys only, unknown ones are never stored
rows: TtlCache[str, object] = TtlCache("API key rows", ttl=ttl_s, max_entries=100_000)


def generation() -> int:
    """Take it before reading a row from the database; pass it to `cached_key_put`."""
    return rows.generation


def cached_key_get(prefix: str):
    """The cached ApiKey row for `prefix`, or None (absent or expired); a hit counts as a use."""
    return rows.get(prefix)


def in_use(within_s: float) -> list[str]:
    """Prefixes of the unexpired rows used in the last `within_s` seconds (the ones to keep warm)."""
    return rows.keys_used_within(within_s)


def cached_key_put(prefix: str, api_key, *, read_generation: int | None = None) -> None:
    """Cache a row read from the database for a request (dropped if the cache was emptied since
    `read_generation`)."""
    rows.set(prefix, api_key, generation=read_generation)


def reload_done(prefix: str, api_key, *, read_generation: int) -> None:
    """A background reload's result: the fresh row (its last use unchanged), or None when the key is gone."""
    if api_key is not None:
        rows.replace(prefix, api_key, generation=read_generation)
    elif read_generation == rows.generation:
        rows.invalidate(prefix)


def api_key_cache_clear(**_signal_kwargs) -> None:
    """Forget every cached row (connected to post_save/post_delete of ApiKey, Tenant and Tier)."""
    rows.clear()


def connect_signals() -> None:
    from django.db.models.signals import post_delete, post_save

    from tenants.models import ApiKey, Tenant, Tier

    for model in (ApiKey, Tenant, Tier):
        for signal in (post_save, post_delete):
            signal.connect(api_key_cache_clear, sender=model, dispatch_uid=f"api_key_cache_clear:{model.__name__}")
