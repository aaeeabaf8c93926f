"""Ending a request: its `Ending` (billing.services.settlement: the record's fields and its cost, priced
once, here), its usage record, then its one `Done` event (inference.protocol).

One path, one way: `job_ending` makes the Ending and the Done event (whose
`usage.cost` is the Ending's); `endings_record` counts it, keeps it in the
worker's durable spool (inference.worker.spool) and hands it through the
spool to billing's settlement service (`EndingsSink`: record written, then
reservation settled; the written records' spend counted). The record is
written (or, while the database is away, kept in the spool) before the
event, so a client that sees the end of its stream can already find the
record. The worker loop (its ending thread, its endings) and the reaper end
requests through here; the insert is idempotent, so a request ended twice
(a slow worker and the reaper racing) still has one record, the first.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.db import connection, connections

from billing.services.settlement import DatabaseAway, Ending, ending_make, endings_settle_start, endings_write
from inference.metrics.requests import billed_observe, requests_observe
from inference.metrics.timeline import requests_add
from inference.protocol import Done, FinishReason, Timing, Usage
from inference.queue import Job

from .events import EventSink
from .spool import ConnectionLost, Spool, spool_open

logger = logging.getLogger(__name__)


@dataclass
class ActiveRequest:
    job: Job
    leased_at: float  # unix time
    started: bool = False  # lease flagged started: events may have reached the client
    first_token_at: float | None = None
    completion_tokens: int = 0
    aborting: bool = False  # cancelled by the client, abort sent to the engine
    next_seq: int = 1  # the number of this request's next event (inference.protocol)

    def seq_take(self) -> int:
        seq, self.next_seq = self.next_seq, self.next_seq + 1
        return seq

    def tokens_so_far(self) -> dict[str, int]:
        """What a request ended early is billed: its prompt only once a token was generated."""
        return {"prompt_tokens": len(self.job.prompt_token_ids) if self.completion_tokens else 0,
                "completion_tokens": self.completion_tokens}

    @property
    def ttft_s(self) -> float | None:
        """Seconds from the enqueue to the first token, if there was one."""
        return None if self.first_token_at is None else max(0.0, self.first_token_at - self.job.enqueued_at)


def endings_spool() -> Spool:
    """This process's spool (settings.WORKER_SPOOL_DIR), whose sink is billing's settlement service."""
    from django.conf import settings

    return spool_open(Path(settings.WORKER_SPOOL_DIR), EndingsSink())


def endings_record(endings: list[Ending]) -> bool:
    """The one path of a request's ending, after its `Ending` was made (`job_ending`): counted
    (inference.metrics: latencies, endings), spooled on disk (inference.worker.spool), then handed to
    billing's settlement service through the spool (`EndingsSink`: the usage records written, their
    admission reservations settled, the written records' tokens and spend counted); what the database or
    Redis could not take now, the spool's flusher retries until it can. The endings themselves go through
    (converted once, for the disk). Never raises; True when the records were written now."""
    if not endings:
        return True
    requests_observe(endings)
    requests_add([{"finish_reason": e.finish_reason, "ttft_s": e.ttft_s} for e in endings])  # the console's hour
    try:
        spool = endings_spool()
        spool.add(endings)
    except Exception:  # noqa: BLE001 - a full disk: still try the database itself
        logger.exception("could not spool the usage records of %s", [e.request_id for e in endings])
        return _record_without_spool(endings)
    written, _settled = spool.process(endings)
    return written


class EndingsSink:
    """The spool's sink (inference.worker.spool.SpoolSink): its items are `Ending`s, kept on disk as
    `Ending.to_json()` objects, written and settled by billing's settlement service
    (billing.services.settlement); the records written are counted (inference.metrics.requests.billed_observe)."""

    @staticmethod
    def request_id(ending: Ending) -> str:
        return ending.request_id

    @staticmethod
    def encode(ending: Ending) -> dict[str, Any]:
        return ending.to_json()

    @staticmethod
    def decode(row: dict[str, Any]) -> Ending:
        return Ending.from_json(row)

    def write(self, endings: list[Ending]) -> None:
        try:
            written = endings_write(endings)
        except DatabaseAway as exc:
            raise ConnectionLost(str(exc)) from exc
        billed_observe(written)

    def settle_start(self, endings: list[Ending]) -> Callable[[], bool]:
        return endings_settle_start(endings)


def _record_without_spool(endings: list[Ending]) -> bool:
    sink = EndingsSink()
    try:
        sink.write(endings)
        written = True
    except Exception:  # noqa: BLE001
        logger.exception("could not write the usage records of %s", [e.request_id for e in endings])
        written = False
    sink.settle_start(endings)()
    return written


def job_ending(
    *,
    job: Job,
    worker_id: str,
    finish_reason: FinishReason,
    prompt_tokens: int = 0,
    cached_tokens: int = 0,
    completion_tokens: int = 0,
    queued_s: float | None = None,
    ttft_s: float | None = None,
    error: str | None = None,
    engine_timing: Any = None,
    now: float | None = None,
    error_param: str | None = None,
    seq: int = 0,
) -> tuple[Ending, Done]:
    """(`Ending`, done event) of a request ending now. Times are seconds since job.enqueued_at;
    `engine_timing` is the engine's own (its RequestOutput.timing), if it ran the request."""
    now = time.time() if now is None else now
    e2e_s = max(0.0, now - job.enqueued_at)
    queued_s = e2e_s if queued_s is None else max(0.0, queued_s)
    ending = ending_make(
        request_id=job.request_id, tenant_id=job.tenant_id, api_key_id=job.api_key_id, model=job.model,
        tier=job.tier, endpoint=job.endpoint, prompt_tokens=prompt_tokens, cached_tokens=cached_tokens,
        completion_tokens=completion_tokens, finish_reason=finish_reason, error=error, queued_s=queued_s,
        ttft_s=ttft_s, duration_s=e2e_s, worker_id=worker_id, batch_id=job.batch_id,
        admitted_at=job.enqueued_at,  # picks the price version (billing)
        created_at=now,  # when it ended, also if the record is written later (spool)
    )
    timing = Timing(queued_s=queued_s, ttft_s=ttft_s, e2e_s=e2e_s)
    if engine_timing is not None:
        timing.engine_queued_s = getattr(engine_timing, "queued_s", None)
        timing.engine_ttft_s = getattr(engine_timing, "ttft_s", None)
        timing.engine_e2e_s = getattr(engine_timing, "e2e_s", None)
    cost = ending.cost.as_usd() if ending.cost is not None else None  # the record's own cost, priced once
    done = Done(request_id=job.request_id, finish_reason=finish_reason,
                usage=Usage(prompt_tokens, cached_tokens, completion_tokens, cost=cost), timing=timing,
                error=error, error_param=error_param, seq=seq)
    return ending, done


def job_finish(*, job: Job, sink: EventSink, **ending: Any) -> None:
    """Record usage, then send the done event (`job_ending`'s arguments)."""
    record, event = job_ending(job=job, **ending)
    endings_record([record])
    sink.send(job.reply_channel, event)


def job_fail(*, job: Job, sink: EventSink, worker_id: str, error: str, prompt_tokens: int = 0,
             completion_tokens: int = 0, error_param: str | None = None, seq: int = 0) -> None:
    job_finish(
        job=job, sink=sink, worker_id=worker_id, finish_reason="error", error=error,
        prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, error_param=error_param, seq=seq,
    )


def db_connections_close() -> None:
    """Close this thread's database connections (threads never get Django's request signals)."""
    if not connection.in_atomic_block:
        connections.close_all()
