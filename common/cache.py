"""Per-process caches with a time to live: what the request path remembers between requests.

    rows = TtlCache("API key rows", ttl=lambda: settings.API_KEY_CACHE_TTL_S)
    row = rows.get(prefix)                       # None: absent or expired
    generation = rows.generation                 # taken before reading the source...
    rows.set(prefix, row, generation=generation)  # ...dropped if a clear came in between
    rows.clear()                                 # a change in this process: forget everything now

One mechanism for the five caches of the serving path (API key rows, served
models, live workers, tier weights, tokenizers), each of which had its own
clock, expiry and invalidation. The rules, the same for all of them:

- An entry lives ``ttl`` seconds from when it was stored. ``ttl`` may be a
  callable, read at each store, so settings changed at run time (and tests)
  apply to the next entry; ``ttl <= 0`` stores nothing (the cache is off),
  ``None`` keeps entries until they are cleared.
- ``clear()`` empties the cache and bumps ``generation``. A value read from the
  source before the clear is stored with the generation taken before the read
  and is then dropped, so a read racing an invalidation in this process cannot
  bring back what the invalidation removed. Other processes are not told:
  they see a change within the TTL, which is why the TTLs are short.
- Refresh ahead (`refresh`): one background task per key reloads an entry
  that is still valid but getting old, so a key in steady use never waits for
  the source on the request path, while no entry outlives its TTL.
- Keep warm (`keep_warm`): one task per cache reloads every key used lately,
  in one call, every half TTL; it ends when no key was used for ``within_s``.
- Keys may be client input (model names): at ``max_entries`` the cache is
  emptied rather than grown.
- Every operation takes a lock, never across an await or a load, so threads
  may share a cache (the tier weights are read from a worker's threads).
  `get_or_load` loads under a second lock: one load at a time, for threads.

Django's cache framework (locmem) was the other candidate: it pickles every
value on `set` and unpickles it on `get` (a model row per request), returns a
copy rather than the row, and has no generation, last use or reload, which
these caches need. The clock is injectable (`clock=`) for tests.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Hashable, Mapping
from typing import Generic, TypeVar

logger = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

_MISSING = object()


class OnePerKey(dict):
    """At most one background task per key on the running loop (refresh-ahead reloads).

    The mapping holds each key's task while it runs (a task needs a strong
    reference), and the task removes itself when it ends. A failure is logged,
    not raised: the cached answer then expires and the next request reads it
    itself.
    """

    def __init__(self, what: str) -> None:
        super().__init__()
        self.what = what  # for the log line of a failure

    def start(self, key: Hashable, work: Callable[[], Awaitable[object]]) -> None:
        """Run `work()` on the running loop unless a task for `key` is still in flight."""
        task = self.get(key)
        if task is None or task.done():
            self[key] = asyncio.get_running_loop().create_task(self._run(key, work))

    async def _run(self, key: Hashable, work: Callable[[], Awaitable[object]]) -> None:
        try:
            await work()
        except Exception:  # noqa: BLE001 - see the class docstring
            logger.warning("%s %s failed", self.what, key, exc_info=True)
        finally:
            self.pop(key, None)


class Entry(Generic[V]):
    __slots__ = ("value", "stored_at", "expires_at", "used_at")

    def __init__(self, value: V, stored_at: float, expires_at: float, used_at: float) -> None:
        self.value, self.stored_at, self.expires_at, self.used_at = value, stored_at, expires_at, used_at


class TtlCache(Generic[K, V]):
    def __init__(
        self,
        name: str,
        *,
        ttl: float | Callable[[], float] | None,
        max_entries: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self._ttl = ttl
        self.max_entries = max_entries
        self.clock = clock
        self._entries: dict[K, Entry[V]] = {}
        self._generation = 0
        self._lock = threading.Lock()
        self._load_lock = threading.Lock()
        self.reloads = OnePerKey(f"{name}: reloading")  # key -> its refresh-ahead task in flight
        self.keeper: asyncio.Task | None = None  # the keep-warm task, on the loop that started it

    # ------------------------------------------------------------ reading
    def ttl_s(self) -> float | None:
        ttl = self._ttl() if callable(self._ttl) else self._ttl
        return None if ttl is None else float(ttl)

    @property
    def generation(self) -> int:
        """Take it before reading the source; pass it to `set`."""
        return self._generation

    def entry(self, key: K) -> Entry[V] | None:
        """The live entry of `key` (a hit counts as a use), or None; an expired one is dropped."""
        now = self.clock()
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            if entry.expires_at <= now:
                del self._entries[key]
                return None
            entry.used_at = now
            return entry

    def get(self, key: K, default=None):
        entry = self.entry(key)
        return default if entry is None else entry.value

    def age(self, entry: Entry[V]) -> float:
        return self.clock() - entry.stored_at

    def __contains__(self, key: object) -> bool:
        with self._lock:
            entry = self._entries.get(key)  # type: ignore[arg-type]
            return entry is not None and entry.expires_at > self.clock()

    def __len__(self) -> int:
        return len(self._entries)

    def keys_used_within(self, seconds: float) -> list[K]:
        """Keys of the live entries used in the last `seconds` (the ones to keep warm)."""
        now = self.clock()
        with self._lock:
            return [key for key, e in self._entries.items() if e.expires_at > now and now - e.used_at <= seconds]

    # ------------------------------------------------------------ writing
    def set(self, key: K, value: V, *, generation: int | None = None) -> bool:
        """Store `value` for a TTL; not when the cache is off or was cleared since `generation`."""
        ttl = self.ttl_s()
        if ttl is not None and ttl <= 0:
            return False
        now = self.clock()
        with self._lock:
            if generation is not None and generation != self._generation:
                return False
            if key not in self._entries and len(self._entries) >= self.max_entries:
                self._entries.clear()
            self._entries[key] = Entry(value, now, float("inf") if ttl is None else now + ttl, now)
            return True

    def replace(self, key: K, value: V, *, generation: int) -> bool:
        """A reload's result: stored for a new TTL, its last use kept, only while `key` is still
        cached and nothing was cleared since `generation`."""
        ttl = self.ttl_s()
        now = self.clock()
        with self._lock:
            entry = self._entries.get(key)
            if generation != self._generation or entry is None or (ttl is not None and ttl <= 0):
                return False
            self._entries[key] = Entry(value, now, float("inf") if ttl is None else now + ttl, entry.used_at)
            return True

    def invalidate(self, key: K) -> None:
        with self._lock:
            self._entries.pop(key, None)

    def clear(self, **_signal_kwargs) -> None:
        """Forget everything; reads begun before now are not stored (fits a Django signal receiver)."""
        with self._lock:
            self._generation += 1
            self._entries.clear()

    # ------------------------------------------------------------ loading
    def get_or_load(self, key: K, load: Callable[[], V]) -> V:
        """The cached value, or `load()`'s, stored; concurrent threads wait for one load."""
        entry = self.entry(key)
        if entry is not None:
            return entry.value
        with self._load_lock:
            entry = self.entry(key)
            if entry is not None:
                return entry.value
            generation = self._generation
            value = load()
            self.set(key, value, generation=generation)
            return value

    def refresh(self, key: K, load: Callable[[], Awaitable[V]]) -> None:
        """Reload `key` in the background (one task per key), storing what `load()` returns."""

        async def reload() -> None:
            generation = self._generation
            self.set(key, await load(), generation=generation)

        self.reloads.start(key, reload)

    def keep_warm(
        self, reload: Callable[[list[K]], Awaitable[Mapping[K, V]]], *, within_s: Callable[[], float]
    ) -> asyncio.Task | None:
        """Ensure the keep-warm task runs on this loop (none while the TTL or `within_s()` is 0)."""
        ttl = self.ttl_s()
        if ttl is None or ttl <= 0 or within_s() <= 0:
            return None
        loop = asyncio.get_running_loop()
        if self.keeper is None or self.keeper.done() or self.keeper.get_loop() is not loop:
            self.keeper = loop.create_task(self._keep_warm(reload, within_s), name=f"{self.name}: keep-warm")
        return self.keeper

    async def _keep_warm(self, reload: Callable[[list[K]], Awaitable[Mapping[K, V]]], within_s) -> None:
        """Every half TTL, `reload(keys used lately)` in one call; a key missing from its answer is
        forgotten (gone at the source). Ends when no key was used for `within_s()`."""
        while True:
            ttl, keep = self.ttl_s(), within_s()
            if ttl is None or ttl <= 0 or keep <= 0:
                return
            await asyncio.sleep(ttl / 2)
            keys = self.keys_used_within(keep)
            if not keys:
                return
            generation = self._generation
            try:
                values = await reload(keys)
            except Exception:  # noqa: BLE001 - the entries expire at their TTL and the next requests read them
                logger.warning("%s: reloading %d entries failed", self.name, len(keys), exc_info=True)
                continue
            for key in keys:
                if key in values:
                    self.replace(key, values[key], generation=generation)
                elif generation == self._generation:
                    self.invalidate(key)
