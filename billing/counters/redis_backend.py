"""The Redis admission backend: every web process and worker shares its counters.

One script call per admission (`ADMIT`: every check and every take, one round
trip) and per settlement; a worker settles a step's requests in one call, sent
before its usage-record insert and read after it (`settle_many_start`).
Redis errors become `AdmissionUnavailable`: the caller refuses the request
(fail closed), it never admits one unchecked.
"""

from __future__ import annotations

import asyncio
import json
import threading
import weakref
from collections.abc import Callable

import redis
import redis.asyncio

from common.cache import TtlCache

from . import redis_scripts as lua
from .base import Actual, AdmissionBackend, AdmissionUnavailable, BucketState, CounterAfter, Decision, Plan, Refusal
from .keys import slots_match

SETTLE_CHUNK = 256  # requests per SETTLE call (Lua's unpack takes a few thousand values at most)
ALERT_MEMO_S = 86400.0  # an alert key is per threshold and period: marked, it stays marked


def _plan_args(prefix: str, plan: Plan) -> list:
    args: list = [prefix, plan.request_id, plan.hold_s, len(plan.buckets), len(plan.slots), len(plan.counters),
                  plan.lease_s, plan.period_end, int(plan.count_only)]
    for b in plan.buckets:
        args += [b.key, b.kind, b.limit, b.cost, b.window_s]
    for s in plan.slots:
        args += [s.key, s.limit]
    for c in plan.counters:
        args += [c.key, c.kind, c.limit, c.amount, c.next_key]
    return args


def _decision(plan: Plan, reply: list) -> Decision:
    status = int(reply[0])
    if status == -1:
        raise ValueError(f"request {plan.request_id!r} already holds a reservation")
    if status == 2:
        return Decision(admitted=False, missing=[str(key) for key in reply[1:]])
    if status == 0:
        kind, key, limit, used, requested, retry = reply[1:7]
        return Decision(admitted=False, refusal=Refusal(
            kind=str(kind), key=str(key), limit=int(limit), used=int(used), requested=int(requested),
            retry_after_s=float(retry)))
    states = []
    for index, bucket in enumerate(plan.buckets):
        remaining, reset = reply[1 + 2 * index], reply[2 + 2 * index]
        states.append(BucketState(key=bucket.key, kind=bucket.kind, limit=bucket.limit, remaining=int(remaining),
                                  reset_s=float(reset)))
    return Decision(admitted=True, buckets=states)


def _settle_arg(items: list[tuple[str, Actual]]) -> str:
    return json.dumps([(rid, a.tokens, a.quota, a.spend, a.at) for rid, a in items])


def _settled(reply: list) -> tuple[int, list[CounterAfter]]:
    """SETTLE's reply: how many reservations were settled, and the counters after."""
    return int(reply[0]), [CounterAfter(key=str(reply[i]), kind=str(reply[i + 1]), value=int(reply[i + 2]),
                                        limit=int(reply[i + 3])) for i in range(1, len(reply), 4)]


class RedisAdmission(AdmissionBackend):
    def __init__(self, *, url: str, prefix: str = "lim", client: redis.Redis | None = None) -> None:
        self.url = url
        self.redis = client or redis.Redis.from_url(url, decode_responses=True, health_check_interval=30,
                                                    socket_timeout=5, socket_connect_timeout=2)
        self.prefix = prefix if prefix.startswith("{") else "{" + prefix + "}"
        self._scripts = {name: self.redis.register_script(getattr(lua, name))
                         for name in ("ADMIT", "SETTLE", "STALE", "SEED", "EXTEND", "CONFIRM")}
        self._alerts_marked: TtlCache[str, bool] = TtlCache("admission alert marks", ttl=ALERT_MEMO_S,
                                                            max_entries=10_000)
        self._settle_conn = None  # settle_many_start's connection, out of the pool between calls
        self._settle_conn_lock = threading.Lock()
        # redis.asyncio clients belong to the event loop that made them
        self._async: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def _call(self, name: str, *args):
        try:
            return self._scripts[name](keys=[], args=[self.prefix, *args])
        except redis.RedisError as exc:
            raise AdmissionUnavailable(str(exc)) from exc

    def _async_script(self, name: str = "ADMIT"):
        loop = asyncio.get_running_loop()
        scripts = self._async.get(loop)
        if scripts is None:
            client = redis.asyncio.Redis.from_url(self.url, decode_responses=True, socket_timeout=5,
                                                  socket_connect_timeout=2)
            scripts = self._async[loop] = {name: client.register_script(getattr(lua, name))
                                           for name in ("ADMIT", "EXTEND", "CONFIRM")}
        return scripts[name]

    async def _acall(self, name: str, *args):
        for attempt in range(2):
            try:
                return await self._async_script(name)(keys=[], args=[self.prefix, *args])
            except redis.ConnectionError as exc:
                # After a Redis restart the pool's idle connections are dead: the first call on one fails
                # without reaching the server (and the connection is dropped); the second takes a new one.
                if attempt:
                    raise AdmissionUnavailable(str(exc)) from exc
            except redis.RedisError as exc:
                raise AdmissionUnavailable(str(exc)) from exc
        raise AssertionError("unreachable")

    def admit(self, plan: Plan) -> Decision:
        return _decision(plan, self._call("ADMIT", *_plan_args(self.prefix, plan)[1:]))

    async def aadmit(self, plan: Plan) -> Decision:
        return _decision(plan, await self._acall("ADMIT", *_plan_args(self.prefix, plan)[1:]))

    def extend(self, request_ids: list[str], seconds: float) -> int:
        return int(self._call("EXTEND", seconds, *request_ids)) if request_ids else 0

    async def aextend(self, request_ids: list[str], seconds: float) -> int:
        return int(await self._acall("EXTEND", seconds, *request_ids)) if request_ids else 0

    def confirm(self, request_id: str) -> bool:
        return bool(self._call("CONFIRM", request_id))

    async def aconfirm(self, request_id: str) -> bool:
        return bool(await self._acall("CONFIRM", request_id))

    def settle(self, request_id: str, actual: Actual) -> list[CounterAfter] | None:
        settled, after = self._settle([(request_id, actual)])
        return after if settled else None

    def settle_many(self, items: list[tuple[str, Actual]]) -> list[CounterAfter]:
        """One script call per SETTLE_CHUNK requests (a worker's step: one): one round trip."""
        after: dict[str, CounterAfter] = {}
        for start in range(0, len(items), SETTLE_CHUNK):
            after.update((counter.key, counter) for counter in self._settle(items[start:start + SETTLE_CHUNK])[1])
        return list(after.values())

    def _settle(self, items: list[tuple[str, Actual]]) -> tuple[int, list[CounterAfter]]:
        return _settled(self._call("SETTLE", _settle_arg(items)))

    def settle_many_start(self, items: list[tuple[str, Actual]]) -> Callable[[], list[CounterAfter]]:
        """Send SETTLE now, read its reply when the returned function is called: Redis runs the script while
        the caller does its own work (the worker: its usage-record insert), and the caller finishes at once.

        On a connection of its own, kept between calls (the worker's finisher settles one step at a time;
        a call that finds it taken uses one of the pool's). NOSCRIPT (Redis restarted since the script was
        loaded): the script did not run; it is loaded and run then. A connection Redis closed (it restarted
        since the last step): the call goes once more through the pool, which reconnects; whether the first
        ran is unknown, and settling again is safe (each reservation is consumed once). Redis still away:
        AdmissionUnavailable, and the caller settles later."""
        if len(items) > SETTLE_CHUNK:
            return super().settle_many_start(items)
        arg = _settle_arg(items)
        with self._settle_conn_lock:
            conn, self._settle_conn = self._settle_conn, None
        try:
            if conn is None:
                conn = self.redis.connection_pool.get_connection()
            conn.send_command("EVALSHA", self._scripts["SETTLE"].sha, 0, self.prefix, arg)
        except redis.ConnectionError:  # its connection went stale (Redis restarted): once more, through the pool
            self._settle_conn_drop(conn)
            after = self._settle(items)[1]  # (AdmissionUnavailable if Redis is still away)
            return lambda: after
        except redis.RedisError as exc:
            self._settle_conn_drop(conn)
            raise AdmissionUnavailable(str(exc)) from exc
        except BaseException:
            self._settle_conn_drop(conn)
            raise

        def finish() -> list[CounterAfter]:
            try:
                reply = conn.read_response()
            except redis.exceptions.NoScriptError:
                self._settle_conn_keep(conn)
                return _settled(self._call("SETTLE", arg))[1]
            except redis.ConnectionError:
                # Closed under it (Redis restarted since the last step): whether the script ran is unknown, and
                # running it again settles only what it did not (each reservation is consumed once).
                self._settle_conn_drop(conn)
                return _settled(self._call("SETTLE", arg))[1]
            except redis.RedisError as exc:
                self._settle_conn_drop(conn)
                raise AdmissionUnavailable(str(exc)) from exc
            except BaseException:
                self._settle_conn_drop(conn)  # its reply may still come: the connection cannot be reused
                raise
            self._settle_conn_keep(conn)
            return _settled(reply)[1]

        return finish

    def _settle_conn_keep(self, conn) -> None:
        with self._settle_conn_lock:
            if self._settle_conn is None:
                self._settle_conn, conn = conn, None
        if conn is not None:  # another settlement kept its own meanwhile
            self.redis.connection_pool.release(conn)

    def _settle_conn_drop(self, conn) -> None:
        if conn is not None:
            conn.disconnect()
            self.redis.connection_pool.release(conn)

    def open_reserved(self, key: str) -> int:
        try:
            return sum(int(v) for v in self.redis.hvals(key + ":open"))
        except redis.RedisError as exc:
            raise AdmissionUnavailable(str(exc)) from exc

    def counter_seed(self, key: str, value: int, ttl_s: int) -> bool:
        return bool(self._call("SEED", key, int(value), max(1, int(ttl_s))))

    def counter_get(self, key: str) -> int | None:
        try:
            value = self.redis.get(key)
        except redis.RedisError as exc:
            raise AdmissionUnavailable(str(exc)) from exc
        return None if value is None else int(value)

    def stale_reservations(self) -> list[str]:
        return [str(rid) for rid in self._call("STALE")]

    def held(self) -> tuple[int, int]:
        """Open reservations (the deadline set), slots (the members of every concurrency key: a SCAN)."""
        try:
            reservations = int(self.redis.zcard(self.prefix + ":resdl"))
            pipe = self.redis.pipeline(transaction=False)
            for key in self.redis.scan_iter(match=slots_match(self.prefix), count=1000):
                pipe.zcard(key)
            slots = sum(int(count) for count in pipe.execute())
        except redis.RedisError as exc:
            raise AdmissionUnavailable(str(exc)) from exc
        return reservations, slots

    def alert_mark(self, key: str, ttl_s: int) -> bool:
        """SET NX once per process and key: a budget past a threshold asks on every settlement after."""
        if key in self._alerts_marked:
            return False
        try:
            first = bool(self.redis.set(key, "1", nx=True, ex=max(1, int(ttl_s))))
        except redis.RedisError as exc:
            raise AdmissionUnavailable(str(exc)) from exc
        self._alerts_marked.set(key, True)
        return first

    def flush(self) -> None:
        self._alerts_marked.clear()
        keys = list(self.redis.scan_iter(match=self.prefix + ":*", count=1000))
        if keys:
            self.redis.delete(*keys)
