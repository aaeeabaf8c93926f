"""In-process JobQueue for the embedded mode (one web process, engine thread).

Same semantics as the Redis backend (see base.py), kept in dicts under one
lock; a Condition wakes the worker when work arrives. The worker registry lives
in the same state (reaping requeues jobs); reply liveness is in-process
(inference.queue.reply_liveness: every channel is alive).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from .base import JobQueue, QueueFull, ReapResult
from .job import Job
from .reply_liveness import InProcessReplyLiveness
from .selection import TenantRing, TierSelector, WeightSource


@dataclass
class _Lease:
    job: Job
    started: bool = False


class MemoryJobQueue(JobQueue):
    def __init__(self, *, weights: WeightSource = None, max_depth: int = 0, heartbeat_timeout: float = 10.0) -> None:
        self.max_depth = max_depth  # per (model, tier); 0 = unbounded
        self.heartbeat_timeout = heartbeat_timeout
        self.selector = TierSelector(weights)
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self.workers = self  # the registry lives in this queue's state (reaping requeues jobs)
        self.replies = InProcessReplyLiveness()  # one process: every reply channel has its reader
        self.flush()

    def flush(self) -> None:
        with self._lock:
            self._rings: dict[tuple[str, str], TenantRing] = {}
            self._queued: dict[str, Job] = {}
            self._leased: dict[str, str] = {}  # request id -> worker id
            self._leases: dict[str, dict[str, _Lease]] = {}  # worker id -> request id -> lease
            self._cancels: dict[str, set[str]] = {}
            self._dropped: dict[str, list[Job]] = {}
            self._heartbeats: dict[str, tuple[float, str, dict[str, Any]]] = {}  # worker -> (expires, model, info)
            self._workers: dict[str, str] = {}  # worker id -> model, kept until reaped or unregistered
            self._reaped: set[str] = set()

    @staticmethod
    def _now() -> float:
        return time.monotonic()

    # ------------------------------------------------------------ web side
    def enqueue(self, job: Job) -> None:
        with self._work:
            if job.request_id in self._queued or job.request_id in self._leased:
                raise ValueError(f"duplicate request id {job.request_id!r}")
            ring = self._rings.setdefault((job.model, job.tier), TenantRing())
            if self.max_depth and ring.size >= self.max_depth:
                raise QueueFull(f"The queue for {job.model} ({job.tier}) is full; retry shortly.")
            self._queued[job.request_id] = job
            ring.push(job.tenant_key, job.request_id)
            self._work.notify()

    async def aenqueue(self, job: Job) -> None:
        self.enqueue(job)  # a lock and a notify: no need to leave the loop

    def cancel(self, request_id: str) -> str:
        with self._work:
            job = self._queued.pop(request_id, None)
            if job is not None:
                self._rings[(job.model, job.tier)].remove(job.tenant_key, request_id)
                self._dropped.setdefault(job.model, []).append(job)
                self._work.notify()
                return "dropped"
            worker = self._leased.get(request_id)
            if worker is not None:
                self._cancels.setdefault(worker, set()).add(request_id)
                return "signalled"
            return "unknown"

    def depths(self, model: str) -> dict[str, int]:
        with self._lock:
            return {tier: ring.size for (m, tier), ring in self._rings.items() if m == model and ring.size}

    # ------------------------------------------------------------ worker side
    def lease(self, worker_id: str, model: str, max_jobs: int) -> list[Job]:
        with self._lock:
            if worker_id in self._reaped or max_jobs <= 0:
                return []
            depths = {tier: ring.size for (m, tier), ring in self._rings.items() if m == model and ring.size}
            jobs = []
            for tier in self.selector.plan(depths, max_jobs):
                request_id = self._rings[(model, tier)].pop()
                if request_id is None:
                    continue
                job = self._queued.pop(request_id)
                self._leased[request_id] = worker_id
                self._leases.setdefault(worker_id, {})[request_id] = _Lease(job)
                jobs.append(job)
            if jobs:
                self._workers.setdefault(worker_id, model)
            return jobs

    def wait_for_work(self, model: str, timeout: float) -> bool:
        def ready() -> bool:
            return bool(self._dropped.get(model)) or any(
                ring.size for (m, _), ring in self._rings.items() if m == model
            )

        with self._work:
            return self._work.wait_for(ready, timeout=timeout)

    def mark_started(self, worker_id: str, request_ids: list[str]) -> set[str]:
        owned = set()
        with self._lock:
            leases = self._leases.get(worker_id, {})
            for request_id in request_ids:
                lease = leases.get(request_id)
                if lease is not None:
                    lease.started = True
                    owned.add(request_id)
        return owned

    def complete(self, worker_id: str, request_id: str) -> bool:
        with self._lock:
            lease = self._leases.get(worker_id, {}).pop(request_id, None)
            if lease is None:
                return False
            self._leased.pop(request_id, None)
            self._cancels.get(worker_id, set()).discard(request_id)
            return True

    def take_cancellations(self, worker_id: str) -> set[str]:
        with self._lock:
            return self._cancels.pop(worker_id, set())

    def take_dropped(self, model: str, limit: int = 100) -> list[Job]:
        with self._lock:
            dropped = self._dropped.get(model, [])
            taken, self._dropped[model] = dropped[:limit], dropped[limit:]
            return taken

    def leases(self, worker_id: str) -> dict[str, bool]:
        with self._lock:
            return {request_id: lease.started for request_id, lease in self._leases.get(worker_id, {}).items()}

    # ------------------------------------------------------------ worker registry (WorkerRegistry)
    # In this queue's own state, under its lock: reaping a worker requeues its jobs.
    def live_workers(self, model: str | None = None) -> list[dict[str, Any]]:
        now = self._now()
        with self._lock:
            return [
                dict(info)
                for expires, worker_model, info in self._heartbeats.values()
                if expires > now and (model is None or worker_model == model)
            ]

    def heartbeat(self, worker_id: str, model: str, info: dict[str, Any]) -> bool:
        with self._lock:
            was_reaped = worker_id in self._reaped
            self._reaped.discard(worker_id)
            payload = {**info, "worker_id": worker_id, "model": model, "ts": time.time()}
            self._heartbeats[worker_id] = (self._now() + self.heartbeat_timeout, model, payload)
            self._workers[worker_id] = model
            return not was_reaped

    def unregister(self, worker_id: str) -> ReapResult:
        with self._work:
            self._heartbeats.pop(worker_id, None)
            result = ReapResult()
            self._reap_locked(worker_id, result)
            self._reaped.discard(worker_id)  # a clean exit leaves no zombie flag behind
            return result

    def reap_dead_workers(self) -> ReapResult:
        now = self._now()
        result = ReapResult()
        with self._work:
            for worker_id in list(self._workers):
                beat = self._heartbeats.get(worker_id)
                if beat is None or beat[0] <= now:
                    self._heartbeats.pop(worker_id, None)
                    self._reap_locked(worker_id, result)
                    result.dead_workers.append(worker_id)
        return result

    def _reap_locked(self, worker_id: str, result: ReapResult) -> None:
        leases = self._leases.pop(worker_id, {})
        self._cancels.pop(worker_id, None)
        self._workers.pop(worker_id, None)
        self._reaped.add(worker_id)
        unstarted = []
        for request_id, lease in leases.items():
            self._leased.pop(request_id, None)
            if lease.started:
                result.failed.append((worker_id, lease.job))
            else:
                unstarted.append(lease.job)
        # Latest first, each to the front: the oldest ends up at the head.
        for job in sorted(unstarted, key=lambda job: job.enqueued_at, reverse=True):
            self._queued[job.request_id] = job
            self._rings.setdefault((job.model, job.tier), TenantRing()).push(job.tenant_key, job.request_id, front=True)
            result.requeued.append(job.request_id)
        if unstarted:
            self._work.notify_all()
