"""JobQueue on Redis: shared by every web replica and worker process.

All state changes are Lua scripts (redis_scripts.py), so a job is never both
queued and leased, and a dead worker's leases are taken exactly once. The
tier order comes from selection.TierSelector in this process; the tenant
round-robin lives in Redis lists, so it is shared by all workers. The worker
registry and reply liveness are parts of their own (inference.queue.redis_workers:
`workers`, `replies`) on the same client and prefix.
"""

from __future__ import annotations

import time
from typing import Any

import redis

from . import redis_scripts as lua
from .base import JobQueue, QueueFull, QueueUnavailable, ReapResult
from .job import Job
from .redis_workers import RedisReplyLiveness, RedisWorkerRegistry, check_worker_id
from .routing import RoutingPolicy
from .selection import TierSelector, WeightSource


class RedisJobQueue(JobQueue):
    remote = True

    def __init__(
        self,
        *,
        url: str,
        prefix: str = "llmq",
        weights: WeightSource = None,
        max_depth: int = 0,
        heartbeat_timeout: float = 10.0,
        routing: RoutingPolicy | None = None,
        client: redis.Redis | None = None,
    ) -> None:
        # Timeouts: a Redis that is restarting must fail a call within seconds, never hang it (the longest
        # blocking call, wait_for_work's BLPOP, lasts about a heartbeat interval).
        self.redis = client or redis.Redis.from_url(url, decode_responses=True, health_check_interval=30,
                                                    socket_connect_timeout=2, socket_timeout=15)
        # A hash tag keeps every key of this queue in one cluster slot.
        self.prefix = prefix if prefix.startswith("{") else "{" + prefix + "}"
        self.max_depth = max_depth
        self.selector = TierSelector(weights)
        self.routing = routing or RoutingPolicy.off()
        # (worker, model) -> monotonic time until which its queued jobs are all preferred by other workers
        self._deferred: dict[tuple[str, str], float] = {}
        self.workers = RedisWorkerRegistry(self.redis, self.prefix, heartbeat_timeout)
        self.replies = RedisReplyLiveness(self.redis, self.prefix)
        self._scripts = {
            name: self.redis.register_script(getattr(lua, name))
            for name in ("ENQUEUE", "LEASE", "CANCEL", "MARK_STARTED", "COMPLETE", "TAKE_CANCELS",
                         "TAKE_CANCELS_AND_DEPTHS", "TAKE_DROPPED", "OLDEST")
        }

    @property
    def heartbeat_timeout(self) -> float:
        return self.workers.heartbeat_timeout

    @heartbeat_timeout.setter
    def heartbeat_timeout(self, seconds: float) -> None:
        self.workers.heartbeat_timeout = seconds

    def _run(self, name: str, *args: Any) -> Any:
        return self._scripts[name](keys=[], args=[self.prefix, *args])

    def _key(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    # ------------------------------------------------------------ web side
    def enqueue(self, job: Job) -> None:
        try:
            status = self._run(
                "ENQUEUE", job.request_id, job.to_json(), job.model, job.tier, job.tenant_key,
                repr(float(job.enqueued_at)), self.max_depth, ",".join(job.prefix_keys),
            )
        except redis.RedisError as exc:
            raise QueueUnavailable() from exc
        if status == -1:
            raise ValueError(f"duplicate request id {job.request_id!r}")
        if status == 0:
            raise QueueFull(f"The queue for {job.model} ({job.tier}) is full; retry shortly.")

    def cancel(self, request_id: str) -> str:
        return self._run("CANCEL", request_id)

    def depths(self, model: str) -> dict[str, int]:
        return _positive(self.redis.hgetall(self._key("depth", model)))

    # ------------------------------------------------------------ autoscaling signals
    def oldest_queued(self, model: str) -> dict[str, float]:
        flat = self._scripts["OLDEST"](keys=[], args=[self.prefix, model])
        return {tier: float(at) for tier, at in zip(flat[::2], flat[1::2])}

    def demand_add(self, model: str, token: str, until: float) -> None:
        key = self._key("demand", model)
        pipe = self.redis.pipeline(transaction=False)
        pipe.zadd(key, {token: until})
        pipe.expireat(key, int(until) + 60)  # a model nobody asks for again leaves no key behind
        try:
            pipe.execute()
        except redis.RedisError as exc:
            raise QueueUnavailable() from exc

    def demand_remove(self, model: str, token: str) -> None:
        self.redis.zrem(self._key("demand", model), token)

    def demand(self, model: str) -> int:
        key, now = self._key("demand", model), time.time()
        pipe = self.redis.pipeline(transaction=False)
        pipe.zremrangebyscore(key, "-inf", now)
        pipe.zcard(key)
        return int(pipe.execute()[1])

    # ------------------------------------------------------------ worker side
    def lease(self, worker_id: str, model: str, max_jobs: int, *, intake_every_s: float = 0.0) -> list[Job]:
        check_worker_id(worker_id)
        if max_jobs <= 0:
            return []
        return self._lease_by_depths(worker_id, model, max_jobs, self.depths(model), intake_every_s)

    def _lease_by_depths(self, worker_id: str, model: str, max_jobs: int, depths: dict[str, int],
                         intake_every_s: float) -> list[Job]:
        if max_jobs <= 0 or not depths:
            return []
        plan = self.selector.plan(depths, max_jobs)
        if not plan:
            return []
        routing = self.routing
        steal = routing.steal_after_s if routing.enabled else 0.0
        raws, wait_ms = self._run("LEASE", model, worker_id, repr(time.time()), repr(float(steal)), routing.scan,
                                  routing.keys_per_worker, max_jobs, routing.balance, repr(float(intake_every_s)), *plan)
        jobs = [Job.from_json(raw) for raw in raws if raw]
        if int(wait_ms) >= 0 and not jobs:
            self._deferred[(worker_id, model)] = time.monotonic() + int(wait_ms) / 1000.0
        else:
            self._deferred.pop((worker_id, model), None)
        return jobs

    def wait_for_work(self, model: str, timeout: float, *, worker_id: str | None = None) -> bool:
        keys = [self._key("wake", model)]
        if worker_id is not None:
            keys.insert(0, self._key("wakew", worker_id))
            deferred = self._deferred.get((worker_id, model), 0.0) - time.monotonic()
            if deferred > 0:
                # What is queued waits on other workers (queue.routing): until the first may be stolen, only an
                # enqueue or a worker that skipped a job for this one wakes it.
                self.redis.blpop(keys, timeout=max(min(timeout, deferred), 0.01))
                return True
        if self.redis.llen(self._key("dropped", model)) or self.depths(model):
            return True
        # BLPOP takes whole or fractional seconds; 0 would block forever.
        return self.redis.blpop(keys, timeout=max(timeout, 0.01)) is not None

    def mark_started(self, worker_id: str, request_ids: list[str]) -> set[str]:
        if not request_ids:
            return set()
        return set(self._run("MARK_STARTED", worker_id, *request_ids))

    def complete(self, worker_id: str, request_id: str) -> bool:
        return bool(self._run("COMPLETE", worker_id, request_id))

    def complete_many(self, worker_id: str, request_ids: list[str]) -> set[str]:
        return set(self._run("COMPLETE", worker_id, *request_ids)) if request_ids else set()

    def take_cancellations(self, worker_id: str) -> set[str]:
        return set(self._run("TAKE_CANCELS", worker_id))

    def take_cancellations_and_lease(self, worker_id: str, model: str, max_jobs: int, *,
                                     intake_every_s: float = 0.0) -> tuple[set[str], list[Job]]:
        """One script takes the cancellations and reads the depths; a second leases, if anything is queued."""
        check_worker_id(worker_id)
        room = [max(0, max_jobs), repr(float(intake_every_s))] if self.routing.enabled else []
        ids, flat = self._run("TAKE_CANCELS_AND_DEPTHS", worker_id, model, *room)
        depths = _positive(dict(zip(flat[::2], flat[1::2])))
        return set(ids), self._lease_by_depths(worker_id, model, max_jobs, depths, intake_every_s)

    def take_dropped(self, model: str, limit: int = 100) -> list[Job]:
        return [Job.from_json(raw) for raw in self._run("TAKE_DROPPED", model, limit)]

    def leases(self, worker_id: str) -> dict[str, bool]:
        raw = self.redis.hgetall(self._key("lease", worker_id))
        return {request_id: value.startswith("1") for request_id, value in raw.items()}

    # ------------------------------------------------------------ worker registry (self.workers)
    def heartbeat(self, worker_id: str, model: str, info: dict[str, Any]) -> bool:
        return self.workers.heartbeat(worker_id, model, info)

    def live_workers(self, model: str | None = None) -> list[dict[str, Any]]:
        return self.workers.live_workers(model)

    def unregister(self, worker_id: str) -> ReapResult:
        return self.workers.unregister(worker_id)

    def reap_dead_workers(self) -> ReapResult:
        return self.workers.reap_dead_workers()

    def flush(self) -> None:
        keys = list(self.redis.scan_iter(match=self.prefix + ":*", count=1000))
        for start in range(0, len(keys), 500):
            self.redis.delete(*keys[start : start + 500])


def _positive(depths: dict[str, str]) -> dict[str, int]:
    """A depth hash as ints, tiers with nothing queued left out."""
    return {tier: int(count) for tier, count in depths.items() if int(count) > 0}
