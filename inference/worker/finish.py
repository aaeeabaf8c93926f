"""Ending a request: its usage record, then its one `Done` event (inference.protocol).

The record is written before the event, so a client that sees the end of its
stream can already find the record. Both the worker loop and the reaper end
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

from django.db import OperationalError, connection, connections

from billing.services.usage import usage_records_insert
from inference.protocol import Done, FinishReason, Timing, Usage
from inference.queue import Job

from .events import EventSink

logger = logging.getLogger(__name__)


@dataclass
class ActiveRequest:
    job: Job
    leased_at: float  # unix time
    started: bool = False  # lease flagged started: events may have reached the client
    first_token_at: float | None = None
    completion_tokens: int = 0
    aborting: bool = False  # cancelled by the client, abort sent to the engine

    def tokens_so_far(self) -> dict[str, int]:
        """What a request ended early is billed: its prompt only once a token was generated."""
        return {"prompt_tokens": len(self.job.prompt_token_ids) if self.completion_tokens else 0,
                "completion_tokens": self.completion_tokens}

    @property
    def ttft_s(self) -> float | None:
        """Seconds from the enqueue to the first token, if there was one."""
        return None if self.first_token_at is None else max(0.0, self.first_token_at - self.job.enqueued_at)


def usage_records_safe(records: list[dict[str, Any]]) -> bool:
    """Write the records (`_usage_records_write`), then settle their admission reservations
    (billing.services.admission: tokens refunded, concurrency slots freed, quota and budget
    counters corrected to the actual cost), then count them (inference.metrics.requests); none
    of it ever raises."""
    from billing.services.admission import admission_settle_records
    from inference.metrics.requests import requests_observe

    written = _usage_records_write(records)
    admission_settle_records(records)
    requests_observe(records, written=written)
    return written


def _usage_records_write(records: list[dict[str, Any]]) -> bool:
    """usage_records_insert (one statement for all `records`), never raising: a database
    hiccup must not kill the loop. True when written.

    Retries a few times on OperationalError (SQLite "database is locked",
    a dropped PostgreSQL connection), reconnecting in between.
    """
    if not records:
        return True
    ids = [record.get("request_id") for record in records]
    for attempt in range(4):
        try:
            usage_records_insert(records)
            return True
        except OperationalError:
            logger.warning("usage records of %s: database busy or gone, retrying", ids)
            _reconnect()
            time.sleep(0.05 * (attempt + 1))
        except Exception:  # noqa: BLE001
            logger.exception("could not write the usage records of %s", ids)
            _reconnect()
            if len(records) > 1:  # one bad record must not cost the others theirs
                return all([_usage_records_write([record]) for record in records])
            return False
    logger.error("gave up writing the usage records of %s", ids)
    return False


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
    }
    timing = Timing(queued_s=queued_s, ttft_s=ttft_s, e2e_s=e2e_s)
    if engine_timing is not None:
        timing.engine_queued_s = getattr(engine_timing, "queued_s", None)
        timing.engine_ttft_s = getattr(engine_timing, "ttft_s", None)
        timing.engine_e2e_s = getattr(engine_timing, "e2e_s", None)
    done = Done(request_id=job.request_id, finish_reason=finish_reason,
                usage=Usage(prompt_tokens, cached_tokens, completion_tokens, cost=_cost(record)), timing=timing,
                error=error,
                error_param=error_param)
    return record, done


def _cost(record: dict[str, Any]) -> dict[str, str] | None:
    """The client's `usage.cost`, by the rule that costs the record; None (no cost shown) if pricing fails."""
    from billing.services.costs import usage_cost_usd

    try:
        return usage_cost_usd(
            model=record["model"], tier=record["tier"], admitted_at=record["admitted_at"],
            prompt_tokens=record["prompt_tokens"], cached_tokens=record["cached_tokens"],
            completion_tokens=record["completion_tokens"], finish_reason=record["finish_reason"],
        )
    except Exception:  # noqa: BLE001 - a done event is never lost to pricing
        logger.exception("pricing %s failed", record["request_id"])
        return None


def job_finish(*, job: Job, sink: EventSink, **ending: Any) -> None:
    """Record usage, then send the done event (`job_ending`'s arguments)."""
    record, event = job_ending(job=job, **ending)
    usage_records_safe([record])
    sink.send(job.reply_channel, event)


def job_fail(*, job: Job, sink: EventSink, worker_id: str, error: str, prompt_tokens: int = 0,
             completion_tokens: int = 0, error_param: str | None = None) -> None:
    job_finish(
        job=job, sink=sink, worker_id=worker_id, finish_reason="error", error=error,
        prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, error_param=error_param,
    )


def db_connections_close() -> None:
    """Close this thread's database connections (threads never get Django's request signals)."""
    if not connection.in_atomic_block:
        connections.close_all()
