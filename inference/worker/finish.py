"""Ending a request: its usage record, then its one engine.done event.

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
from typing import Any

from django.db import OperationalError, connection

from billing.services.usage import usage_records_insert
from inference.queue import Job

from .events import EventSink

logger = logging.getLogger(__name__)


def delta_event(*, request_id: str, text: str, token_ids: list[int], logprobs: list | None) -> dict[str, Any]:
    return {"type": "engine.delta", "request_id": request_id, "text": text, "token_ids": list(token_ids), "logprobs": logprobs}


def done_event(
    *,
    request_id: str,
    finish_reason: str,
    prompt_tokens: int,
    cached_tokens: int,
    completion_tokens: int,
    timing: dict[str, Any],
    error: str | None = None,
    stop_reason: Any = None,
    error_param: str | None = None,
) -> dict[str, Any]:
    event = {
        "type": "engine.done",
        "request_id": request_id,
        "finish_reason": finish_reason,
        "usage": {"prompt_tokens": prompt_tokens, "cached_tokens": cached_tokens, "completion_tokens": completion_tokens},
        "timing": timing,
        "error": error,
        "stop_reason": stop_reason,
    }
    if error_param is not None:
        event["error_param"] = error_param  # the OpenAI parameter at fault (EngineValidationError.param)
    return event


def usage_records_safe(records: list[dict[str, Any]]) -> bool:
    """Write the records (`_usage_records_write`), then settle their admission reservations
    (billing.services.admission: tokens refunded, concurrency slots freed, quota and budget
    counters corrected to the actual cost); neither ever raises."""
    from billing.services.admission import admission_settle_records

    written = _usage_records_write(records)
    admission_settle_records(records)
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
    finish_reason: str,
    prompt_tokens: int = 0,
    cached_tokens: int = 0,
    completion_tokens: int = 0,
    queued_s: float | None = None,
    ttft_s: float | None = None,
    error: str | None = None,
    stop_reason: Any = None,
    extra_timing: dict[str, Any] | None = None,
    now: float | None = None,
    error_param: str | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(usage record fields, done event) of a request ending now. Times are seconds since job.enqueued_at."""
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
    timing = {"queued_s": queued_s, "ttft_s": ttft_s, "e2e_s": e2e_s, **(extra_timing or {})}
    event = done_event(
        request_id=job.request_id, finish_reason=finish_reason, prompt_tokens=prompt_tokens,
        cached_tokens=cached_tokens, completion_tokens=completion_tokens, timing=timing, error=error,
        stop_reason=stop_reason, error_param=error_param,
    )
    cost = _cost(record)
    if cost is not None:
        event["usage"]["cost"] = cost
    return record, event


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
