"""The JobQueue contract, shared by the in-process and the Redis backend.

A job moves through three states:

  queued  - on its (model, tier) queue, in its tenant's FIFO sub-queue;
  leased  - taken by one worker (`lease`), which owns it until `complete`.
            A lease carries a `started` flag, set (`mark_started`) before the
            worker sends the job's first event to the client (on a remote
            queue, while the engine step that samples that event runs);
  gone    - completed, dropped by `cancel` while queued, or failed by the reaper.

Workers prove they are alive with `heartbeat` (stored with a TTL of
`heartbeat_timeout`). `reap_dead_workers` takes every lease of a worker whose
heartbeat expired: unstarted jobs go back to the FRONT of their queues (nothing
reached the client, so another worker may run them from scratch), started jobs
are handed back as `ReapResult.failed` for the caller to finish with an error
event and a usage record (inference.worker.reaper does both). A reaped worker
that was only slow, not dead, learns it from its next `heartbeat` (returns
False) and must drop everything it holds without sending anything more.

Cancelling a leased job only signals its worker (`take_cancellations`), which
aborts it in the engine within one step. Cancelling a queued job removes it at
once and parks it on a per-model "dropped" list; a worker of that model takes
it (`take_dropped`) and ends it with an "abort" event and a zero-token usage
record, so every request still ends in exactly one done event and one record.

The pull order is inference.queue.selection: weighted round-robin across
tiers, round-robin across tenants inside a tier; with several workers of a
model, inference.queue.routing lets each prefer the jobs whose prompt prefix
it holds (never for longer than a short bound).

Besides the jobs, a queue is made of two small interfaces, each in its own
module: the worker registry (inference.queue.worker_registry: heartbeats,
reaping, live workers) and reply liveness (inference.queue.reply_liveness).
"""

from __future__ import annotations

import abc
import asyncio

from common.errors import ServiceUnavailable

from .job import Job
from .reply_liveness import ReplyLiveness
from .worker_registry import ReapResult, WorkerRegistry

__all__ = ["JobQueue", "QueueFull", "QueueUnavailable", "ReapResult", "ReplyLiveness", "WorkerRegistry"]


class QueueFull(ServiceUnavailable):
    """The (model, tier) queue is at its bound; the API answers 503 (or 429)."""

    code = "queue_full"


class QueueUnavailable(ServiceUnavailable):
    """The queue's store (Redis) cannot be reached: the API answers 503 with Retry-After, never 500."""

    code = "queue_unavailable"

    def __init__(self, message: str = "The job queue cannot be reached right now. Please retry shortly.", **kwargs):
        kwargs.setdefault("headers", {"Retry-After": "2"})
        super().__init__(message, **kwargs)


class JobQueue(WorkerRegistry, ReplyLiveness, abc.ABC):
    """Jobs, leases and cancellations, plus the two small interfaces it is made of, each also a part
    of its own for callers that need only that: the worker registry (`workers`, a `WorkerRegistry`:
    heartbeat, unregister, reap_dead_workers, live_workers) and reply liveness (`replies`, a
    `ReplyLiveness`, which reply_channels_touch/alive delegate to)."""

    workers: WorkerRegistry  # set by each backend (the queue itself where the registry shares its state)
    replies: ReplyLiveness  # set by each backend
    remote = False  # calls are network round trips (workers overlap some of them with engine steps)

    # ------------------------------------------------------------ web side
    @abc.abstractmethod
    def enqueue(self, job: Job) -> None:
        """Queue `job` at the tail of its tenant's sub-queue. Raises QueueFull,
        or ValueError when a job with this request_id is already known."""

    async def aenqueue(self, job: Job) -> None:
        """`enqueue` for the event loop: in a thread by default. (Not an asyncio Redis client:
        on a busy loop each of its several loop iterations waits behind the other requests'
        work, which made it the slower of the two.)"""
        await asyncio.to_thread(self.enqueue, job)

    @abc.abstractmethod
    def cancel(self, request_id: str) -> str:
        """Client went away. Returns "dropped" (was queued: removed now),
        "signalled" (leased: its worker aborts it within a step) or "unknown"."""

    @abc.abstractmethod
    def depths(self, model: str) -> dict[str, int]:
        """Queued (not leased) jobs per tier for `model`; tiers with none may be absent."""

    def depth(self, model: str, tier: str) -> int:
        return int(self.depths(model).get(tier, 0))

    # ------------------------------------------------------------ autoscaling signals (inference.metrics.live)
    @abc.abstractmethod
    def oldest_queued(self, model: str) -> dict[str, float]:
        """Tier -> enqueued_at (unix seconds) of the oldest job queued for `model`; tiers with none absent."""

    @abc.abstractmethod
    def demand_add(self, model: str, token: str, until: float) -> None:
        """A request waits (until the unix time `until` at the latest) for a worker of `model`, which has none:
        what scales a model up from zero (its queue is empty, as nothing is queued for a model nobody serves)."""

    @abc.abstractmethod
    def demand_remove(self, model: str, token: str) -> None:
        """That request stopped waiting (a worker came, or it gave up)."""

    @abc.abstractmethod
    def demand(self, model: str) -> int:
        """Requests waiting now for a worker of `model` (entries past their `until` do not count)."""

    # ------------------------------------------------------------ worker side
    @abc.abstractmethod
    def lease(self, worker_id: str, model: str, max_jobs: int, *, intake_every_s: float = 0.0) -> list[Job]:
        """Take up to `max_jobs` queued jobs of `model` in policy order and lease
        them to `worker_id`. Returns [] while the worker is marked reaped. `intake_every_s`: the
        seconds between this worker's intakes while busy (0: unknown), for routing's step-aware wait
        (inference.queue.routing)."""

    @abc.abstractmethod
    def wait_for_work(self, model: str, timeout: float, *, worker_id: str | None = None) -> bool:
        """Block up to `timeout` seconds until `model` may have queued or dropped
        jobs. A hint only: callers lease afterwards and may find nothing. With `worker_id`,
        jobs its last lease left to the workers they prefer (inference.queue.routing) do not
        count until the first of them may be stolen, and a worker that skips a job for this
        one wakes it."""

    @abc.abstractmethod
    def mark_started(self, worker_id: str, request_ids: list[str]) -> set[str]:
        """Flag leases as started; returns the ids the worker still owns."""

    @abc.abstractmethod
    def complete(self, worker_id: str, request_id: str) -> bool:
        """Release a finished job. False if the worker no longer owned it."""

    def complete_many(self, worker_id: str, request_ids: list[str]) -> set[str]:
        """`complete` for several jobs (a step's finished requests); the ids released.
        A remote backend does it in one round trip."""
        return {request_id for request_id in request_ids if self.complete(worker_id, request_id)}

    @abc.abstractmethod
    def take_cancellations(self, worker_id: str) -> set[str]:
        """Request ids of this worker's leases that clients cancelled (cleared)."""

    def take_cancellations_and_lease(self, worker_id: str, model: str, max_jobs: int, *,
                                     intake_every_s: float = 0.0) -> tuple[set[str], list[Job]]:
        """`take_cancellations`, then `lease`: what a worker asks before each engine step.

        A remote backend answers both in fewer round trips (Redis: one when
        nothing is queued, the common case between steps of a busy worker).
        """
        cancelled = self.take_cancellations(worker_id)
        return cancelled, self.lease(worker_id, model, max_jobs, intake_every_s=intake_every_s)

    @abc.abstractmethod
    def take_dropped(self, model: str, limit: int = 100) -> list[Job]:
        """Jobs of `model` cancelled while queued, to be ended with an abort event."""

    @abc.abstractmethod
    def leases(self, worker_id: str) -> dict[str, bool]:
        """Request id -> started flag for the worker's current leases."""

    # ------------------------------------------------------------ reply channels' liveness (self.replies)
    def reply_channels_touch(self, names: list[str], ttl_s: float) -> None:
        self.replies.reply_channels_touch(names, ttl_s)

    def reply_channels_alive(self, names: set[str]) -> set[str]:
        return self.replies.reply_channels_alive(names)

    @abc.abstractmethod
    def flush(self) -> None:
        """Forget everything (tests)."""
