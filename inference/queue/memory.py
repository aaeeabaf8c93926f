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
from .routing import AffinityTable, RoutingPolicy
from .selection import TenantRing, TierSelector, WeightSource


@dataclass
class _Lease:
    job: Job
    started: bool = False


class MemoryJobQueue(JobQueue):
    def __init__(self, *, weights: WeightSource = None, max_depth: int = 0, heartbeat_timeout: float = 10.0,
                 routing: RoutingPolicy | None = None) -> None:
        self.max_depth = max_depth  # per (model, tier); 0 = unbounded
        self.heartbeat_timeout = heartbeat_timeout
        self.routing = routing or RoutingPolicy.off()
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
            self._affinity = AffinityTable()  # queue.routing
            self._demand: dict[str, dict[str, float]] = {}  # model -> token -> until (unix seconds)
            self._deferred: dict[tuple[str, str], float] = {}  # (worker, model) -> monotonic time (routing)

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

    # ------------------------------------------------------------ autoscaling signals
    def oldest_queued(self, model: str) -> dict[str, float]:
        with self._lock:
            return {tier: min(self._queued[item].enqueued_at for _, item in ring.heads(len(ring.ring)))
                    for (m, tier), ring in self._rings.items() if m == model and ring.size}

    def demand_add(self, model: str, token: str, until: float) -> None:
        with self._lock:
            self._demand.setdefault(model, {})[token] = until

    def demand_remove(self, model: str, token: str) -> None:
        with self._lock:
            self._demand.get(model, {}).pop(token, None)

    def demand(self, model: str) -> int:
        now = time.time()
        with self._lock:
            waiting = self._demand.get(model, {})
            for token in [token for token, until in waiting.items() if until <= now]:
                del waiting[token]
            return len(waiting)

    # ------------------------------------------------------------ worker side
    def lease(self, worker_id: str, model: str, max_jobs: int, *, intake_every_s: float = 0.0) -> list[Job]:
        with self._work:
            if worker_id in self._reaped or max_jobs <= 0:
                self._affinity.report(worker_id, 0, self._now(), intake_every_s, bool(self._leases.get(worker_id)))
                return []
            depths = {tier: ring.size for (m, tier), ring in self._rings.items() if m == model and ring.size}
            jobs: list[Job] = []
            wait: float | None = None
            routing, wall, now = self.routing, time.time(), self._now()
            exhausted: set[str] = set()  # tiers whose scan found nothing to take (the same again in this call)
            for tier in self.selector.plan(depths, max_jobs):
                ring = self._rings[(model, tier)]
                heads = [] if tier in exhausted else ring.heads(routing.scan if routing.enabled else 1)
                exhausted.add(tier)
                for tenant, request_id in heads:
                    job = self._queued[request_id]
                    left = self._routing_wait(job, worker_id, wall, now) if routing.enabled else 0.0
                    if left > 0:
                        wait = left if wait is None else min(wait, left)
                        continue
                    ring.pop_from(tenant)
                    del self._queued[request_id]
                    self._leased[request_id] = worker_id
                    self._leases.setdefault(worker_id, {})[request_id] = _Lease(job)
                    jobs.append(job)
                    if routing.enabled:
                        self._affinity.claim(model, job.prefix_keys, worker_id, self._live, routing.keys_per_worker)
                    exhausted.discard(tier)
                    break
            self._affinity.report(worker_id, max_jobs - len(jobs), now, intake_every_s,
                                  bool(self._leases.get(worker_id)))
            if wait is not None and not jobs:
                self._deferred[(worker_id, model)] = now + wait
                self._work.notify_all()  # the preferred workers
            else:
                self._deferred.pop((worker_id, model), None)
            if jobs:
                self._workers.setdefault(worker_id, model)
            return jobs

    def _live(self, worker_id: str) -> bool:
        beat = self._heartbeats.get(worker_id)
        return beat is not None and beat[0] > self._now()

    def _routing_wait(self, job: Job, worker_id: str, wall: float, now: float) -> float:
        """Seconds `worker_id` leaves `job` to the worker it prefers (queue.routing); 0: take it now."""
        owner = self._affinity.preferred(job.model, job.prefix_keys,
                                         lambda other: other == worker_id or self._live(other))
        if owner is None or owner == worker_id or not self._affinity.has_room(owner, now):
            return 0.0
        if len(self._leases.get(owner, ())) - len(self._leases.get(worker_id, ())) >= self.routing.balance:
            return 0.0
        left = job.enqueued_at + self.routing.steal_after_s - wall
        return 0.0 if left <= 0 else self._affinity.owner_wait(owner, now, left)

    def wait_for_work(self, model: str, timeout: float, *, worker_id: str | None = None) -> bool:
        def ready() -> bool:
            if self._dropped.get(model):
                return True
            if self._deferred.get((worker_id, model), 0.0) > self._now():
                return False  # what is queued waits on other workers (queue.routing)
            return any(ring.size for (m, _), ring in self._rings.items() if m == model)

        with self._work:
            deferred = self._deferred.get((worker_id, model), 0.0) - self._now()
            if deferred > 0:
                self._work.wait_for(ready, timeout=min(timeout, deferred))
                return True
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
        self._affinity.forget(worker_id)
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
