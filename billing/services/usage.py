"""Usage records: exactly one per request, whatever its outcome.

The worker writes it when a request finishes (stop, length, abort) or fails
(error); the reaper writes it for a started request of a dead worker. Both
may race for the same request, so creation is idempotent on request_id: the
unique constraint decides. `usage_records_insert` writes the records of many
requests (a worker's engine step) as one `INSERT ... ON CONFLICT DO NOTHING`;
`usage_record_create` writes one and returns it, the loser of a race reading
the winner's. The cost goes into the same INSERT (billing.services.costs), so
a record never exists without it, and a replayed finish is never billed twice.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from django.db import IntegrityError, connection, transaction

from billing.ledger import cached_clamp
from billing.models import UsageRecord
from billing.services.costs import instant, usage_rows_cost
from billing.services.usage_sql import usage_insert_param, usage_insert_sql
from tenants.models import ApiKey

logger = logging.getLogger(__name__)

_FINISH_REASONS = set(UsageRecord.FinishReason.values)


def usage_record_fields(
    *,
    request_id: str,
    tenant_id: int,
    api_key_id: int | None,
    model: str,
    tier: str,
    endpoint: str = "chat.completions",
    prompt_tokens: int = 0,
    cached_tokens: int = 0,
    completion_tokens: int = 0,
    finish_reason: str,
    error: str | None = None,
    queued_s: float = 0.0,
    ttft_s: float | None = None,
    duration_s: float = 0.0,
    worker_id: str = "",
    batch_id: str = "",
    admitted_at: float | datetime | None = None,
    created_at: float | datetime | None = None,
    costing: tuple | None = None,
) -> dict[str, Any]:
    """The model fields of one request's record, checked and clamped (counts >= 0, cached <= prompt:
    billing.ledger's clamp, which every reader of the records relies on).

    `admitted_at` (the job's enqueued_at, unix seconds, or a datetime; default
    now) picks the price version; the cost columns are added by `usage_rows_cost`,
    from `costing` when the caller has it already (`usage_cost`'s result for
    these same fields: the worker's, for the client's `usage.cost`).
    `created_at` (default now): when the request ended, also for a record written
    later (a worker's spool after a database outage), so it counts in its own hour.
    `batch_id` (a `/v1/batches` public id; empty for a live request): the record is
    a batch line's, priced at its version's batch price (billing.money.batch_terms).
    """
    if finish_reason not in _FINISH_REASONS:
        raise ValueError(f"finish_reason must be one of {sorted(_FINISH_REASONS)}, not {finish_reason!r}")
    prompt_tokens = max(0, int(prompt_tokens))
    return {
        "request_id": request_id,
        "tenant_id": tenant_id,
        "api_key_id": api_key_id,
        "model": model[:100],
        "tier": tier[:40],
        "endpoint": endpoint[:40],
        "prompt_tokens": prompt_tokens,
        "cached_tokens": cached_clamp(prompt_tokens=prompt_tokens, cached_tokens=cached_tokens),
        "completion_tokens": max(0, int(completion_tokens)),
        "finish_reason": finish_reason,
        "error": error or "",
        "queued_s": max(0.0, float(queued_s)),
        "ttft_s": None if ttft_s is None else max(0.0, float(ttft_s)),
        "duration_s": max(0.0, float(duration_s)),
        "worker_id": (worker_id or "")[:100],
        "batch_id": _batch_id_check(batch_id),
        "admitted_at": instant(admitted_at),
        "created_at": instant(created_at),
        "costing": costing,
    }


def _batch_id_check(batch_id: str | None) -> str:
    """A batch's public id as recorded ("" for a live request); one that does not fit is refused, never cut
    (a cut id would name another batch, or none)."""
    batch_id = batch_id or ""
    if len(batch_id) > UsageRecord._meta.get_field("batch_id").max_length:
        raise ValueError(f"batch_id is a batch's public id, not {batch_id[:60]!r}...")
    return batch_id


def _drop_deleted_keys(rows: list[dict[str, Any]]) -> None:
    """A key deleted while its request ran: keep the record, without the key (one query for all rows)."""
    key_ids = {row["api_key_id"] for row in rows if row["api_key_id"] is not None}
    if not key_ids:
        return
    live = set(ApiKey.objects.filter(pk__in=key_ids).values_list("pk", flat=True))
    for row in rows:
        if row["api_key_id"] is not None and row["api_key_id"] not in live:
            row["api_key_id"] = None


def usage_record_create(**fields: Any) -> tuple[UsageRecord, bool]:
    """Create the request's record, or return the existing one (created False).

    Takes `usage_record_fields`' arguments. The first write wins: a second call
    with other numbers changes nothing.
    """
    row = usage_record_fields(**fields)
    usage_rows_cost([row])
    _drop_deleted_keys([row])
    request_id = row.pop("request_id")
    with transaction.atomic():
        record, created = UsageRecord.objects.get_or_create(request_id=request_id, defaults=row)
    if not created:
        logger.info("usage record for %s already exists; keeping the first one", request_id)
    return record, created


def usage_records_insert(records: Iterable[Mapping[str, Any]]) -> int:
    """Write the records of several requests in one statement; return how many were given.

    Each item takes `usage_record_fields`' arguments (a bad one raises
    ValueError before anything is written). A request that already has a
    record keeps it (`ON CONFLICT DO NOTHING`: the first write wins, as in
    `usage_record_create`). One round trip whatever the number of records
    (billing.services.usage_sql: the API keys' check is a join in the same
    statement), instead of five or six per record.
    """
    rows = [usage_record_fields(**record) for record in records]
    if not rows:
        return 0
    usage_rows_cost(rows)  # in the same INSERT: a record never exists without its cost
    try:
        _insert(rows)
    except IntegrityError:
        if connection.in_atomic_block:
            raise
        # a key deleted after the statement's join saw it (its foreign key is checked at commit): the join drops it now
        _insert(rows)
    return len(rows)


def _insert(rows: list[dict[str, Any]]) -> None:
    sql, param = usage_insert_sql(connection.vendor), usage_insert_param(rows)
    if connection.in_atomic_block:  # a caller's transaction: a savepoint keeps it usable after a failure
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql, [param])
    else:  # one statement: it commits by itself
        with connection.cursor() as cursor:
            cursor.execute(sql, [param])
