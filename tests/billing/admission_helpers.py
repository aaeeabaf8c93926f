"""Both admission backends behind one fixture, with a clock the tests move.

The in-process backend reads an injected clock. The Redis one reads Redis's
`TIME`, which no test can move, so `advance(s)` shifts the stored times back
by `s` instead (bucket TATs, slot expiries, reservation deadlines): to the
script that is the same as `s` seconds passing. Redis tests use db 7 (or
ADMISSION_TEST_REDIS_URL), every test under its own prefix.
"""

from __future__ import annotations

import os
import uuid

import pytest

from billing.counters.memory import MemoryAdmission
from billing.counters.redis_backend import RedisAdmission

REDIS_TEST_URL = os.environ.get("ADMISSION_TEST_REDIS_URL", "redis://127.0.0.1:6379/7")


def require_redis() -> None:
    import redis

    try:
        redis.Redis.from_url(REDIS_TEST_URL, socket_connect_timeout=1).ping()
    except redis.RedisError:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"Redis at {REDIS_TEST_URL} is required under CI")
        pytest.skip(f"Redis at {REDIS_TEST_URL} is not running")


class Clock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def redis_advance(backend: RedisAdmission, seconds: float) -> None:
    r = backend.redis
    for key in r.scan_iter(match=backend.prefix + ":*", count=1000):
        kind = r.type(key)
        if kind == "string" and ":rb:" in key:
            ttl = r.pttl(key)
            r.set(key, f"{float(r.get(key)) - seconds:.6f}", px=max(1, ttl - int(seconds * 1000)) if ttl > 0 else None)
        elif kind == "zset":
            for member, score in r.zrange(key, 0, -1, withscores=True):
                r.zadd(key, {member: score - seconds})


def make_backend(name: str):
    """(backend, advance(seconds)) of the named kind, empty."""
    if name == "memory":
        clock = Clock()
        backend = MemoryAdmission(clock=clock)

        def advance(seconds: float) -> None:
            clock.now += seconds

        return backend, advance
    require_redis()
    backend = RedisAdmission(url=REDIS_TEST_URL, prefix=f"test:{uuid.uuid4().hex}")
    return backend, lambda seconds: redis_advance(backend, seconds)


@pytest.fixture(params=["memory", "redis"])
def backend_and_clock(request):
    backend, advance = make_backend(request.param)
    backend.kind = request.param
    yield backend, advance
    backend.flush()
