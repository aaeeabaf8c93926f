"""Ending a request: its usage record, then its one `Done` event (inference.protocol).

The record is written (or, while the database is away, kept in the worker's
durable spool: inference.worker.spool) before the event, so a client that sees
the end of its stream can already find the record. Both the worker loop and the reaper end
requests through here (the loop writes the records of a step's finished
requests in one insert: `job_ending`, `usage_records_safe`); the insert is
idempotent, so a request ended twice (a slow worker and the reaper racing)
still has one record, the first.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from django.db import InterfaceError, OperationalError, connection, connections

from billing.services.usage import usage_records_insert
from common.outage import Outage
from inference.protocol import Done, FinishReason, Timing, Usage
from inference.queue import Job

from .events import EventSink

logger = logging.getLogger(__name__)
_pricing_outage = Outage(logger, "pricing finished requests (database)")


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


def usage_records_safe(records: list[dict[str, Any]]) -> bool:
    """Spool the records on disk (inference.worker.spool), then write them and, overlapping the insert,
    settle their admission reservations (billing.services.admission: tokens refunded, concurrency slots
    freed, quota and budget counters corrected to the actual cost); what the database or Redis could not
    take now, the spool's flusher retries until it can. Each ending is counted at once
    (inference.metrics.requests), its tokens and spend when its record is written. Never raises; True
    when the records were written now."""
    if not records:
        return True
    from inference.metrics.requests import requests_observe
    from inference.metrics.timeline import requests_add

    from .spool import spool_get

    requests_observe(records)
    requests_add(records)  # the operator console's last hour
    spool = spool_get()
    try:
        spool.add(records)
    except Exception:  # noqa: BLE001 - a full disk: still try the database itself
        logger.exception("could not spool the usage records of %s", [r.get("request_id") for r in records])
        return _write_without_spool(records)
    written, _settled = spool.process(records)
    return written


def usage_records_write(records: list[dict[str, Any]]) -> None:
    """usage_records_insert (one statement for all `records`); spool.ConnectionLost when the database is away
    (the connection is closed, so the next attempt opens a fresh one)."""
    from .spool import ConnectionLost

    from inference.metrics.requests import billed_observe

    try:
        usage_records_insert(records)
    except (OperationalError, InterfaceError) as exc:
        _reconnect()
        raise ConnectionLost(str(exc).strip() or repr(exc)) from exc
    billed_observe(records)


def _write_without_spool(records: list[dict[str, Any]]) -> bool:
    from billing.services.admission import admission_settle_records

    from inference.metrics.requests import billed_observe

    try:
        usage_records_insert(records)
        written = True
        billed_observe(records)
    except Exception:  # noqa: BLE001
        logger.exception("could not write the usage records of %s", [r.get("request_id") for r in records])
        _reconnect()
        written = False
    admission_settle_records(records)
    return written


def _reconnect() -> None:
    try:
        if connection.in_atomic_block:
            return  # not ours to close (tests wrap everything in a transaction)
        connection.close()  # the next query opens a fresh connection
    except Exception:  # noqa: BLE001
        pass


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
) -> tuple[dict[str, Any], Done]:
    """(usage record fields, done event) of a request ending now. Times are seconds since job.enqueued_at;
    `engine_timing` is the engine's own (its RequestOutput.timing), if it ran the request."""
    now = time.time() if now is None else now
    e2e_s = max(0.0, now - job.enqueued_at)
    queued_s = e2e_s if queued_s is None else max(0.0, queued_s)
    record = {
        "request_id": job.request_id,
        "tenant_id": job.tenant_id,
        "api_key_id": job.api_key_id,
        "model": job.model,
        "tier": job.tier,
        "endpoint": job.endpoint,
        "prompt_tokens": prompt_tokens,
        "cached_tokens": cached_tokens,
        "completion_tokens": completion_tokens,
        "finish_reason": finish_reason,
        "error": error,
        "queued_s": queued_s,
        "ttft_s": ttft_s,
        "duration_s": e2e_s,
        "worker_id": worker_id,
        "admitted_at": job.enqueued_at,  # picks the price version (billing)
        "created_at": now,  # when it ended, also if the record is written later (spool)
    }
    timing = Timing(queued_s=queued_s, ttft_s=ttft_s, e2e_s=e2e_s)
    if engine_timing is not None:
        timing.engine_queued_s = getattr(engine_timing, "queued_s", None)
        timing.engine_ttft_s = getattr(engine_timing, "ttft_s", None)
        timing.engine_e2e_s = getattr(engine_timing, "e2e_s", None)
    costing = _costing(record)
    if costing is not None:  # one costing for the record, its settlement and the client's usage.cost
        record["costing"] = costing
    cost = costing[2].as_usd() if costing is not None else None
    done = Done(request_id=job.request_id, finish_reason=finish_reason,
                usage=Usage(prompt_tokens, cached_tokens, completion_tokens, cost=cost), timing=timing,
                error=error, error_param=error_param, seq=seq)
    return record, done


def _costing(record: dict[str, Any]) -> tuple | None:
    """The request's costing (billing.services.costs.usage_cost); None (no cost shown, the insert
    costs the record itself) if pricing fails."""
    from billing.services.costs import instant, usage_cost

    try:
        costing = usage_cost(
            model=record["model"], tier=record["tier"], admitted_at=instant(record["admitted_at"]),
            prompt_tokens=record["prompt_tokens"], cached_tokens=record["cached_tokens"],
            completion_tokens=record["completion_tokens"], finish_reason=record["finish_reason"],
        )
    except Exception as exc:  # noqa: BLE001 - a done event is never lost to pricing (the record is costed when written)
        _pricing_outage.failed(f"{record['request_id']}: {exc!r}")
        return None
    _pricing_outage.ok()
    return costing


def job_finish(*, job: Job, sink: EventSink, **ending: Any) -> None:
    """Record usage, then send the done event (`job_ending`'s arguments)."""
    record, event = job_ending(job=job, **ending)
    usage_records_safe([record])
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
