"""The Redis backend's two small interfaces besides the jobs: its worker registry
(`RedisWorkerRegistry`: heartbeats with a TTL, the workers hash, reaping through the REAP_WORKER
script and the orphans list) and its reply liveness (`RedisReplyLiveness`: one key with a TTL per
reply channel). Both work on the queue's Redis client and key prefix; RedisJobQueue is made of them.
"""

from __future__ import annotations

import json
import time
from typing import Any

import redis

from . import redis_scripts as lua
from .base import QueueUnavailable
from .job import Job
from .worker_registry import ReapResult


def check_worker_id(worker_id: str) -> None:
    if not worker_id or "\t" in worker_id:
        raise ValueError("worker id must be a non-empty string without tabs")


class RedisWorkerRegistry:
    """WorkerRegistry on Redis: every key under `prefix` (the queue's, with its hash tag)."""

    def __init__(self, client: redis.Redis, prefix: str, heartbeat_timeout: float) -> None:
        self.redis = client
        self.prefix = prefix
        self.heartbeat_timeout = heartbeat_timeout
        self._scripts = {name: client.register_script(getattr(lua, name)) for name in ("HEARTBEAT", "REAP_WORKER")}

    def _run(self, name: str, *args: Any) -> Any:
        return self._scripts[name](keys=[], args=[self.prefix, *args])

    def _key(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    def heartbeat(self, worker_id: str, model: str, info: dict[str, Any]) -> bool:
        check_worker_id(worker_id)
        payload = json.dumps({**info, "worker_id": worker_id, "model": model, "ts": time.time()})
        ttl_ms = max(1, int(self.heartbeat_timeout * 1000))
        return not self._run("HEARTBEAT", worker_id, model, payload, ttl_ms)

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


class RedisReplyLiveness:
    """ReplyLiveness on Redis: `<prefix>:reply:<channel>` exists while the channel has a reader."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.redis = client
        self.prefix = prefix

    def reply_channels_touch(self, names: list[str], ttl_s: float) -> None:
        pipe = self.redis.pipeline(transaction=False)
        for name in names:
            pipe.set(f"{self.prefix}:reply:{name}", "1", px=max(1, int(ttl_s * 1000)))
        pipe.execute()

    def reply_channels_alive(self, names: set[str]) -> set[str]:
        ordered = sorted(names)
        if not ordered:
            return set()
        values = self.redis.mget([f"{self.prefix}:reply:{name}" for name in ordered])
        return {name for name, value in zip(ordered, values) if value is not None}
