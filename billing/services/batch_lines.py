"""A Batch API line's ending: priced at its version's batch price and recorded once, by the one settlement path.

The batch runner (batches) calls `batch_line_bill` for a line that ran (completed, or failed after it
generated tokens; a line that never ran is not billed). It is `ending_make` (priced once, at the batch
price: billing.money.batch_terms), `endings_write` (the usage record, `INSERT ... ON CONFLICT DO NOTHING`
on request_id: the first write wins, a retry changes nothing) and `endings_settle_start` (the line's
admission reservation, if it has one, consumed once): the same functions the worker's live requests end
through, with the record's `batch_id` set. Billing imports nothing of batches: the runner passes the ids.

Idempotence: the request id is the line's (`<batch public id>-<line no>`, set once when the line is first
claimed and kept across retries, batches.services.runs), so a line billed twice (a runner killed after its
record was written, the line released and run again) keeps its first record. Call it in the same
transaction as `batch_line_finish` so that the line's outcome and its record commit together; the
reservation is then settled once that transaction commits.
"""

from __future__ import annotations

from datetime import datetime

from django.db import transaction

from billing.services.costs import instant
from billing.services.settlement import Ending, ending_make, endings_settle_start, endings_write


def batch_line_bill(
    *,
    request_id: str,
    batch_id: str,
    tenant_id: int,
    api_key_id: int | None,
    model: str,
    tier: str,
    endpoint: str,
    prompt_tokens: int,
    cached_tokens: int,
    completion_tokens: int,
    finish_reason: str,
    admitted_at: float | datetime,
    created_at: float | datetime | None = None,
    error: str | None = None,
    queued_s: float = 0.0,
    ttft_s: float | None = None,
    duration_s: float = 0.0,
    worker_id: str = "",
) -> Ending:
    """Price one finished batch line at the batch price and write its usage record, once; its `Ending` as
    priced (`.cost`: the line's cost, for its output's `usage`).

    `request_id` must be the line's (`<batch_id>-<line no>`: ValueError otherwise, so a line is never billed
    under another batch's id). `admitted_at` picks the price version (the runner passes the batch's start,
    so every line of a batch is priced by one version); `tier` (the tenant's) picks the multiplier, which
    composes with the batch discount as with the list price. A second call for the same request id writes
    nothing (the first record stands) and returns the same pricing for the same arguments. Raises what
    pricing or the database raise (PriceUnavailable, DatabaseAway): nothing was written, the caller retries
    the line later.
    """
    if not batch_id or not request_id.startswith(f"{batch_id}-"):
        raise ValueError(f"a batch line's request id is `<batch id>-<line no>`, not {request_id!r} "
                         f"for batch {batch_id!r}")
    ending = ending_make(
        request_id=request_id, batch_id=batch_id, tenant_id=tenant_id, api_key_id=api_key_id, model=model,
        tier=tier, endpoint=endpoint, prompt_tokens=prompt_tokens, cached_tokens=cached_tokens,
        completion_tokens=completion_tokens, finish_reason=finish_reason, error=error, queued_s=queued_s,
        ttft_s=ttft_s, duration_s=duration_s, worker_id=worker_id,
        admitted_at=instant(admitted_at).timestamp(),
        created_at=instant(created_at).timestamp(),
    )
    (written,) = endings_write([ending])
    transaction.on_commit(lambda: endings_settle_start([written])())
    return written
