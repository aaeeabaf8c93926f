"""JobQueue on Redis: shared by every web replica and worker process.

All state changes are Lua scripts (redis_scripts.py), so a job is never both
queued and leased, and a dead worker's leases are taken exactly once. The
tier order comes from selection.TierSelector in this process; the tenant
round-robin lives in Redis lists, so it is shared by all workers.
"""

from __future__ import annotations

import json
import time
from typing import Any

import redis

from . import redis_scripts as lua
from .base import JobQueue, QueueFull, QueueUnavailable, ReapResult
from .job import Job
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
        client: redis.Redis | None = None,
    ) -> None:
        # Timeouts: a Redis that is restarting must fail a call within seconds, never hang it (the longest
        # blocking call, wait_for_work's BLPOP, lasts about a heartbeat interval).
        self.redis = client or redis.Redis.from_url(url, decode_responses=True, health_check_interval=30,
                                                    socket_connect_timeout=2, socket_timeout=15)
        # A hash tag keeps every key of this queue in one cluster slot.
        self.prefix = prefix if prefix.startswith("{") else "{" + prefix + "}"
        self.max_depth = max_depth
        self.heartbeat_timeout = heartbeat_timeout
        self.selector = TierSelector(weights)
        self._scripts = {
            name: self.redis.register_script(getattr(lua, name))
            for name in ("ENQUEUE", "LEASE", "CANCEL", "MARK_STARTED", "COMPLETE", "TAKE_CANCELS",
                         "TAKE_CANCELS_AND_DEPTHS", "TAKE_DROPPED", "HEARTBEAT", "REAP_WORKER")
        }

    def _run(self, name: str, *args: Any) -> Any:
        return self._scripts[name](keys=[], args=[self.prefix, *args])

    def _key(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    @staticmethod
    def _check_worker_id(worker_id: str) -> None:
        if not worker_id or "\t" in worker_id:
            raise ValueError("worker id must be a non-empty string without tabs")

    # ------------------------------------------------------------ web side
    def enqueue(self, job: Job) -> None:
        try:
            status = self._run(
                "ENQUEUE", job.request_id, job.to_json(), job.model, job.tier, job.tenant_key,
                repr(float(job.enqueued_at)), self.max_depth,
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

    def live_workers(self, model: str | None = None) -> list[dict[str, Any]]:
        try:
            workers = [w for w, m in self.redis.hgetall(self._key("workers")).items() if model is None or m == model]
            payloads = self.redis.mget([self._key("hb", w) for w in workers]) if workers else []
        except redis.RedisError as exc:
            raise QueueUnavailable() from exc
        now = time.time()
        out = []
        for payload in payloads:
            if payload:
                info = json.loads(payload)
                if now - float(info.get("ts", now)) < self.heartbeat_timeout:
                    out.append(info)
        return out

    # ------------------------------------------------------------ worker side
    def lease(self, worker_id: str, model: str, max_jobs: int) -> list[Job]:
        self._check_worker_id(worker_id)
        if max_jobs <= 0:
            return []
        return self._lease_by_depths(worker_id, model, max_jobs, self.depths(model))

    def _lease_by_depths(self, worker_id: str, model: str, max_jobs: int, depths: dict[str, int]) -> list[Job]:
        if max_jobs <= 0 or not depths:
            return []
        plan = self.selector.plan(depths, max_jobs)
        if not plan:
            return []
        return [Job.from_json(raw) for raw in self._run("LEASE", model, worker_id, *plan) if raw]

    def wait_for_work(self, model: str, timeout: float) -> bool:
        if self.redis.llen(self._key("dropped", model)) or self.depths(model):
            return True
        # BLPOP takes whole or fractional seconds; 0 would block forever.
        return self.redis.blpop([self._key("wake", model)], timeout=max(timeout, 0.01)) is not None

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

    def take_cancellations_and_lease(self, worker_id: str, model: str, max_jobs: int) -> tuple[set[str], list[Job]]:
        """One script takes the cancellations and reads the depths; a second leases, if anything is queued."""
        self._check_worker_id(worker_id)
        ids, flat = self._run("TAKE_CANCELS_AND_DEPTHS", worker_id, model)
        depths = _positive(dict(zip(flat[::2], flat[1::2])))
        return set(ids), self._lease_by_depths(worker_id, model, max_jobs, depths)

    def take_dropped(self, model: str, limit: int = 100) -> list[Job]:
        return [Job.from_json(raw) for raw in self._run("TAKE_DROPPED", model, limit)]

    def heartbeat(self, worker_id: str, model: str, info: dict[str, Any]) -> bool:
        self._check_worker_id(worker_id)
        payload = json.dumps({**info, "worker_id": worker_id, "model": model, "ts": time.time()})
        ttl_ms = max(1, int(self.heartbeat_timeout * 1000))
        return not self._run("HEARTBEAT", worker_id, model, payload, ttl_ms)

    def unregister(self, worker_id: str) -> ReapResult:
        result = ReapResult()
        self._reap(worker_id, force=True, result=result)
        return result

    def reap_dead_workers(self) -> ReapResult:
        result = ReapResult()
        workers = list(self.redis.hgetall(self._key("workers")))
        if workers:
            alive = self.redis.exists  # one EXISTS per worker; the list is short
            for worker_id in workers:
                if not alive(self._key("hb", worker_id)) and self._reap(worker_id, force=False, result=result):
                    result.dead_workers.append(worker_id)
        # Started jobs land on the orphan list inside the script; claiming them one
        # by one with LPOP hands each to exactly one reaper, also after a reaper
        # crashed between the script and the finishing of its jobs.
        self._claim_orphans(result)
        return result

    def _reap(self, worker_id: str, *, force: bool, result: ReapResult) -> bool:
        reaped, requeued, _failed = self._run("REAP_WORKER", worker_id, "1" if force else "0")
        result.requeued.extend(requeued)
        if force:
            self._claim_orphans(result, only_worker=worker_id)
        return bool(reaped)

    def _claim_orphans(self, result: ReapResult, only_worker: str | None = None) -> None:
        key = self._key("orphans")
        if only_worker is None:
            while (raw := self.redis.lpop(key)) is not None:
                worker_id, _, job = raw.partition("\t")
                result.failed.append((worker_id, Job.from_json(job)))
            return
        for raw in self.redis.lrange(key, 0, -1):
            worker_id, _, job = raw.partition("\t")
            if worker_id == only_worker and self.redis.lrem(key, 1, raw):
                result.failed.append((worker_id, Job.from_json(job)))

    def leases(self, worker_id: str) -> dict[str, bool]:
        raw = self.redis.hgetall(self._key("lease", worker_id))
        return {request_id: value.startswith("1") for request_id, value in raw.items()}

    def reply_channels_touch(self, names: list[str], ttl_s: float) -> None:
        pipe = self.redis.pipeline(transaction=False)
        for name in names:
            pipe.set(self._key("reply", name), "1", px=max(1, int(ttl_s * 1000)))
        pipe.execute()

    def reply_channels_alive(self, names: set[str]) -> set[str]:
        ordered = sorted(names)
        if not ordered:
            return set()
        values = self.redis.mget([self._key("reply", name) for name in ordered])
        return {name for name, value in zip(ordered, values) if value is not None}

    def flush(self) -> None:
        keys = list(self.redis.scan_iter(match=self.prefix + ":*", count=1000))
        for start in range(0, len(keys), 500):
            self.redis.delete(*keys[start : start + 500])


def _positive(depths: dict[str, str]) -> dict[str, int]:
    """A depth hash as ints, tiers with nothing queued left out."""
    return {tier: int(count) for tier, count in depths.items() if int(count) > 0}
