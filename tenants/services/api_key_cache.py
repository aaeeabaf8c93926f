"""A short-lived, per-process cache of API key rows for the inference hot path.

`aapi_key_verify` (the completion endpoints and the WebSocket) would otherwise
look the key row up in the database on every request, through a hop to the
database thread, on the way to the first token. A row found by its prefix is
kept here (a `common.cache.TtlCache`) for ``settings.API_KEY_CACHE_TTL_S``
seconds (default 2; 0 turns the cache off). What stays per request: the secret is still checked against the row's
digest in constant time, and expiry against the clock, on every request.

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

Unknown prefixes: a well-formed key whose prefix names no row is remembered
as unknown (`unknown`, same TTL, kept warm the same way, at most 65,536
prefixes, emptied rather than grown) so that it is refused the way a known
prefix with a wrong secret is: from memory, after the same HMAC
(`api_keys._check`), not after a database query each time. (Found rows were
cached and unknown ones were not, so the time of a 401 told whether a key
prefix existed.) Either kind's first use, or first after a pause longer than
the keep-warm window, reads the database. Creating a key empties both caches,
here and in every web process (`key_events`), so a new key works at once.

What a row brings: its tenant, tier (with the tier's per-model limits, `TierModelLimit`, prefetched: one query
more per row read, none per request) and the relations the apps above register (billing: the budget row).

Freshness: any save or delete of an ApiKey, Tenant, Tier or TierModelLimit in this process
(revoking through `api_key_revoke`, the admin's suspend/change-tier actions,
the keys API) empties the cache at once, so in one process a revoked key or a
suspended tenant is refused on the very next request, as before. Other web
processes are told over Redis pub/sub when REDIS_URL is set (`key_events`:
within milliseconds), else, or while Redis is away, notice within the TTL.
(LiteLLM's proxy caches verified keys for 60 s by default; the window here is
kept short on purpose.)
"""

from __future__ import annotations

from django.conf import settings

from common.cache import TtlCache


def ttl_s() -> float:  # read per call: settings changed at run time (and in tests) apply to the next entry
    return float(settings.API_KEY_CACHE_TTL_S)


def keep_warm_s() -> float:
    return float(settings.API_KEY_CACHE_KEEP_WARM_S)


# prefix -> ApiKey with tenant__tier (and its model_limits); prefixes come from well-formed keys only
rows: TtlCache[str, object] = TtlCache("API key rows", ttl=ttl_s, max_entries=100_000)
# well-formed prefixes that named no row when read (client input: bounded, emptied when full)
unknown: TtlCache[str, bool] = TtlCache("unknown API key prefixes", ttl=ttl_s, max_entries=65_536)


def generation() -> int:
    """Take it before reading a row from the database; pass it to `cached_key_put`."""
    return rows.generation


def cached_key_get(prefix: str):
    """The cached ApiKey row for `prefix`, or None (absent or expired); a hit counts as a use."""
    return rows.get(prefix)


def unknown_generation() -> int:
    """Take it before a lookup that may find nothing; pass it to `cached_unknown_put`."""
    return unknown.generation


def cached_unknown(prefix: str) -> bool:
    """True when `prefix` named no key when last read (within the TTL)."""
    return unknown.get(prefix) is not None


def cached_unknown_put(prefix: str, *, read_generation: int) -> None:
    unknown.set(prefix, True, generation=read_generation)


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
    """Forget every cached row and unknown prefix (on any change of an ApiKey, Tenant, Tier or a tier's per-model
    limit: key_events)."""
    rows.clear()
    unknown.clear()

