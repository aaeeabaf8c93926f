"""common.cache: the per-process TTL cache of the request path, and its background reloads."""

import asyncio
import contextlib
import logging
import threading
import time

import pytest

from common.cache import OnePerKey, TtlCache


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock():
    return Clock()


def test_an_entry_lives_its_ttl_from_when_it_was_stored(clock):
    cache = TtlCache("t", ttl=2.0, clock=clock)
    assert cache.get("a") is None and cache.get("a", "dflt") == "dflt"
    assert cache.set("a", 1)
    clock.now += 1.5
    assert cache.get("a") == 1 and "a" in cache
    assert cache.age(cache.entry("a")) == 1.5
    clock.now += 0.5
    assert cache.get("a") is None and "a" not in cache
    assert len(cache) == 0  # the expired entry was dropped, not kept


def test_the_ttl_is_read_at_each_store_and_zero_turns_the_cache_off(clock):
    ttl = {"s": 1.0}
    cache = TtlCache("t", ttl=lambda: ttl["s"], clock=clock)
    cache.set("short", 1)
    ttl["s"] = 10.0
    cache.set("long", 2)
    clock.now += 5
    assert cache.get("short") is None and cache.get("long") == 2
    ttl["s"] = 0
    assert not cache.set("off", 3)
    assert cache.get("off") is None
    forever = TtlCache("t", ttl=None, clock=clock)
    forever.set("a", 1)
    clock.now += 1e9
    assert forever.get("a") == 1


def test_falsy_values_are_cached_values(clock):
    cache = TtlCache("t", ttl=5.0, clock=clock)
    cache.set("unknown", None)
    assert "unknown" in cache and cache.entry("unknown").value is None
    assert cache.get("unknown", "absent") is None


def test_invalidate_and_clear(clock):
    cache = TtlCache("t", ttl=5.0, clock=clock)
    cache.set("a", 1)
    cache.set("b", 2)
    cache.invalidate("a")
    cache.invalidate("never-there")
    assert cache.get("a") is None and cache.get("b") == 2
    before = cache.generation
    cache.clear(sender=object(), instance=object())  # usable as a Django signal receiver
    assert cache.get("b") is None and cache.generation == before + 1


def test_a_read_begun_before_a_clear_is_not_stored(clock):
    cache = TtlCache("t", ttl=5.0, clock=clock)
    generation = cache.generation  # a request starts reading the source...
    cache.clear()  # ...this process changes the row meanwhile...
    assert not cache.set("a", "old row", generation=generation)  # ...and the old row arrives
    assert cache.get("a") is None
    assert cache.set("a", "new row", generation=cache.generation)
    assert cache.get("a") == "new row"


def test_replace_keeps_the_last_use_and_only_updates_what_is_still_cached(clock):
    cache = TtlCache("t", ttl=2.0, clock=clock)
    assert not cache.replace("a", 1, generation=cache.generation)  # not cached: a reload does not add it
    cache.set("a", 1)
    clock.now += 1.5
    used_at = cache.entry("a").used_at
    clock.now += 0.4
    assert cache.replace("a", 2, generation=cache.generation)
    entry = cache.entry("a")
    assert entry.value == 2 and cache.age(entry) == 0  # a new TTL from the reload...
    assert cache.keys_used_within(0.3) == ["a"]  # (entry() above was a use)
    clock.now += 1.9
    assert cache.get("a") == 2
    stale = cache.generation
    cache.clear()
    cache.set("a", 3)
    assert not cache.replace("a", 4, generation=stale)
    assert cache.get("a") == 3 and used_at < cache.entry("a").used_at


def test_keys_used_within(clock):
    cache = TtlCache("t", ttl=10.0, clock=clock)
    cache.set("old", 1)
    clock.now += 3
    cache.set("new", 2)
    clock.now += 1
    assert cache.keys_used_within(2) == ["new"]
    cache.get("old")
    assert sorted(cache.keys_used_within(2)) == ["new", "old"]
    clock.now += 6  # "old" expired (stored at 1000, ttl 10)
    assert cache.keys_used_within(100) == ["new"]


def test_at_max_entries_the_cache_empties_rather_than_grows(clock):
    cache = TtlCache("t", ttl=10.0, max_entries=3, clock=clock)
    for key in "abc":
        cache.set(key, key)
    cache.set("c", "again")  # an existing key does not count as growth
    assert len(cache) == 3
    cache.set("d", "d")
    assert len(cache) == 1 and cache.get("d") == "d" and cache.get("a") is None


def test_get_or_load_loads_once_for_concurrent_threads(clock):
    cache = TtlCache("t", ttl=10.0, clock=clock)
    loads: list[int] = []
    start = threading.Barrier(8)

    def load():
        loads.append(1)
        time.sleep(0.05)  # the other threads arrive while this one reads
        return {"gold": 7}

    results: list[dict] = []

    def reader():
        start.wait()
        results.append(cache.get_or_load("weights", load))

    threads = [threading.Thread(target=reader) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(loads) == 1 and results == [{"gold": 7}] * 8
    clock.now += 10
    assert cache.get_or_load("weights", lambda: {"gold": 8}) == {"gold": 8}  # expired: loaded again


def test_concurrent_threads_never_see_an_expired_or_torn_entry():
    cache = TtlCache("t", ttl=0.001)
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer(name):
        n = 0
        while not stop.is_set():
            n += 1
            cache.set(name, (name, n))
            if n % 50 == 0:
                cache.clear()

    def reader():
        try:
            while not stop.is_set():
                for name in ("w0", "w1"):
                    value = cache.get(name)
                    assert value is None or value[0] == name
                    cache.keys_used_within(1.0)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(f"w{i}",)) for i in range(2)]
    threads += [threading.Thread(target=reader) for _ in range(2)]
    for thread in threads:
        thread.start()
    time.sleep(0.3)
    stop.set()
    for thread in threads:
        thread.join()
    assert errors == []


async def test_refresh_reloads_in_the_background_once_per_key(clock):
    cache = TtlCache("t", ttl=10.0, clock=clock)
    cache.set("m", "v1")
    gate = asyncio.Event()
    calls: list[str] = []

    async def load():
        calls.append("m")
        await gate.wait()
        return "v2"

    cache.refresh("m", load)
    cache.refresh("m", load)  # one in flight: not started again
    task = cache.reloads["m"]
    await asyncio.sleep(0)
    assert cache.get("m") == "v1"
    gate.set()
    await task
    assert calls == ["m"] and cache.get("m") == "v2" and not cache.reloads


async def test_a_refresh_that_raced_a_clear_is_dropped(clock):
    cache = TtlCache("t", ttl=10.0, clock=clock)
    cache.set("m", "v1")
    gate = asyncio.Event()

    async def load():
        await gate.wait()
        return "old"

    cache.refresh("m", load)
    task = cache.reloads["m"]
    await asyncio.sleep(0)  # the reload has begun reading
    cache.clear()
    gate.set()
    await task
    assert "m" not in cache


@pytest.fixture
async def stop_keeper():
    caches: list[TtlCache] = []
    yield caches.append
    for cache in caches:
        if cache.keeper is not None and not cache.keeper.done():
            cache.keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await cache.keeper


async def test_keep_warm_reloads_the_keys_in_use_and_forgets_the_gone(stop_keeper):
    cache = TtlCache("t", ttl=0.2)
    stop_keeper(cache)
    asked: list[list[str]] = []

    async def reload(keys):
        asked.append(sorted(keys))
        return {key: f"{key}-fresh" for key in keys if key != "gone"}

    for key in ("a", "gone"):
        cache.set(key, f"{key}-first")
    keeper = cache.keep_warm(reload, within_s=lambda: 5.0)
    assert keeper is not None and cache.keep_warm(reload, within_s=lambda: 5.0) is keeper  # one per loop
    await asyncio.sleep(0.15)  # one round, at half the TTL
    assert asked == [["a", "gone"]]
    assert cache.get("a") == "a-fresh" and cache.get("gone") is None
    await asyncio.sleep(0.2)  # past the first TTL: still there, reloaded meanwhile
    assert cache.get("a") == "a-fresh" and len(asked) >= 2


async def test_keep_warm_ends_when_nothing_is_used_and_logs_failures(stop_keeper, caplog):
    cache = TtlCache("t", ttl=0.1)
    stop_keeper(cache)
    assert cache.keep_warm(lambda keys: None, within_s=lambda: 0) is None  # off

    async def failing(keys):
        raise RuntimeError("database gone")

    cache.set("a", 1)
    with caplog.at_level(logging.WARNING, logger="common.cache"):
        keeper = cache.keep_warm(failing, within_s=lambda: 0.07)
        await asyncio.wait_for(keeper, 2)  # ends by itself once "a" was not used for 0.07 s
    assert "t: reloading 1 entries failed" in [r.getMessage() for r in caplog.records]
    assert cache.get("a") is None  # expired at its TTL


async def test_one_task_per_key_at_a_time_and_a_failure_frees_the_key(caplog):
    tasks = OnePerKey("reloading")
    runs: list[str] = []
    gate = asyncio.Event()

    async def work(name: str) -> None:
        runs.append(name)
        await gate.wait()
        raise RuntimeError("database gone")

    tasks.start("a", lambda: work("a"))
    tasks.start("a", lambda: work("a-again"))  # in flight: not started
    tasks.start("b", lambda: work("b"))
    await asyncio.sleep(0)
    assert runs == ["a", "b"] and set(tasks) == {"a", "b"}
    gate.set()
    with caplog.at_level(logging.WARNING, logger="common.cache"):
        await asyncio.gather(*list(tasks.values()))
    assert not tasks  # each task removed itself
    assert [r.getMessage() for r in caplog.records] == ["reloading a failed", "reloading b failed"]
    gate.clear()
    tasks.start("a", lambda: work("a"))  # the next start runs again
    await asyncio.sleep(0)
    assert runs == ["a", "b", "a"]
    task = tasks["a"]
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert not tasks
