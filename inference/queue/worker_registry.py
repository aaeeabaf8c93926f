"""The worker registry, one of the small interfaces a job queue is made of: workers prove they are
alive (`heartbeat`), leave (`unregister`), are listed (`live_workers`) and, once their heartbeat
expired, are reaped (`reap_dead_workers`) with what they held (`ReapResult`).

Semantics: inference.queue.base. Implemented by both backends (memory: in the queue's own state,
under its lock; Redis: inference.queue.redis_workers). A caller that needs only this (the reaper,
the heartbeat thread, capacity checks, metrics) can be typed against `WorkerRegistry`.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from .job import Job


@dataclass
class ReapResult:
    dead_workers: list[str] = field(default_factory=list)
    requeued: list[str] = field(default_factory=list)  # request ids put back at the front
    failed: list[tuple[str, Job]] = field(default_factory=list)  # (worker id, started job)


@runtime_checkable
class WorkerRegistry(Protocol):
    heartbeat_timeout: float  # seconds without a heartbeat before a worker counts as dead

    @abc.abstractmethod
    def heartbeat(self, worker_id: str, model: str, info: dict[str, Any]) -> bool:
        """Record that the worker is alive (TTL heartbeat_timeout). False means it
        had been reaped: it owns nothing any more and must drop all its work."""
        ...

    @abc.abstractmethod
    def unregister(self, worker_id: str) -> ReapResult:
        """Clean exit: forget the heartbeat and reap whatever the worker still holds."""
        ...

    @abc.abstractmethod
    def reap_dead_workers(self) -> ReapResult:
        """Requeue (front) unstarted and hand back started leases of dead workers.
        Each dead worker's leases are processed atomically, exactly once."""
        ...

    @abc.abstractmethod
    def live_workers(self, model: str | None = None) -> list[dict[str, Any]]:
        """Latest heartbeat payload of each worker younger than the timeout
        (all models when `model` is None). [] means nobody serves the model."""
        ...
