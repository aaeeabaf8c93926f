"""Usage records: exactly one per request, whatever its outcome.

The worker writes it when a request finishes (stop, length, abort) or fails
(error); the reaper writes it for a started request of a dead worker. Both
may race for the same request, so creation is idempotent on request_id: the
unique constraint decides, and get_or_create turns the loser into a read.
"""

from __future__ import annotations

import logging

from django.db import transaction

from tenants.models import ApiKey, UsageRecord

logger = logging.getLogger(__name__)

_FINISH_REASONS = set(UsageRecord.FinishReason.values)


def usage_record_create(
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
) -> tuple[UsageRecord, bool]:
    """Create the request's record, or return the existing one (created False).

    The first write wins: a second call with other numbers changes nothing.
    """
    if finish_reason not in _FINISH_REASONS:
        raise ValueError(f"finish_reason must be one of {sorted(_FINISH_REASONS)}, not {finish_reason!r}")
    if api_key_id is not None and not ApiKey.objects.filter(pk=api_key_id).exists():
        api_key_id = None  # the key was deleted while the request ran; keep the record anyway
    prompt_tokens = max(0, int(prompt_tokens))
    defaults = {
        "tenant_id": tenant_id,
        "api_key_id": api_key_id,
        "model": model[:100],
        "tier": tier[:40],
        "endpoint": endpoint[:40],
        "prompt_tokens": prompt_tokens,
        "cached_tokens": min(max(0, int(cached_tokens)), prompt_tokens),
        "completion_tokens": max(0, int(completion_tokens)),
        "finish_reason": finish_reason,
        "error": error or "",
        "queued_s": max(0.0, float(queued_s)),
        "ttft_s": None if ttft_s is None else max(0.0, float(ttft_s)),
        "duration_s": max(0.0, float(duration_s)),
        "worker_id": (worker_id or "")[:100],
    }
    with transaction.atomic():
        record, created = UsageRecord.objects.get_or_create(request_id=request_id, defaults=defaults)
    if not created:
        logger.info("usage record for %s already exists; keeping the first one", request_id)
    return record, created
