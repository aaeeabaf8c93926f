"""OpenAI's batch queue limit: the prompt tokens a tenant may have enqueued for one model across its unfinished
batches. A batch's tokens are counted when it is validated (`Batch.input_tokens`); it takes its place in the
queue as it starts (`in_progress`), under a lock on the tenant's row, so two batches validated at once cannot
both pass a limit that holds one; it leaves the queue when it ends (completed, failed, expired, cancelled).

The limit is the tier's `batch_queue_tokens` (0: none), or the tier's per-model row's when that sets one. A batch
that does not fit fails at once with OpenAI's `token_limit_exceeded`, and runs nothing.
"""

from __future__ import annotations

from django.db.models import F

from batches.models import Batch
from batches.selectors import queued_tokens
from tenants.models import Tenant, TierModelLimit


def batch_queue_limit(*, tier, model: str) -> int:
    """Prompt tokens the tier's tenants may have enqueued for `model`; 0: no limit."""
    own = (TierModelLimit.objects.filter(tier=tier, model_name=model)
           .values_list("batch_queue_tokens", flat=True).first())
    return int(own if own is not None else tier.batch_queue_tokens or 0)


def queue_refusal(*, batch: Batch, model: str, input_tokens: int, limit: int) -> dict | None:
    """OpenAI's `token_limit_exceeded` error item when `batch` (with `input_tokens`) does not fit the tenant's
    queue for `model` under `limit` (batch_queue_limit, read before the transaction), else None. Call first in
    the transaction that starts the batch: it locks the tenant's row until that transaction ends."""
    if not limit:
        return None
    # a write, not SELECT ... FOR UPDATE: SQLite has no row locks, and a transaction's first write takes its
    # database-wide write lock, so on both databases the sum below is read after any rival's commit
    Tenant.objects.filter(pk=batch.tenant_id).update(slug=F("slug"))
    held = queued_tokens(tenant_id=batch.tenant_id, model=model, exclude_pk=batch.pk)
    if held + input_tokens <= limit:
        return None
    if input_tokens > limit:
        advice = "This batch alone is larger than the limit: split it into smaller batches."
    else:
        advice = (f"Your unfinished batches hold {held:,} of them. Please try again once some in_progress "
                  "batches have been completed.")
    return {"code": "token_limit_exceeded", "param": None, "line": None,
            "message": f"Enqueued token limit reached for {model} in organization {batch.tenant.slug}. "
                       f"Limit: {limit:,} enqueued tokens; this batch holds {input_tokens:,}. {advice}"}
