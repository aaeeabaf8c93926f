"""The operator console's reads of the ledger: spend per tenant (the rollups, then the records after them),
requests and worker errors since an instant, and the time to first token over recent requests."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from billing.models import UsageRecord
from billing.services.latency_rollups import ttft_percentiles
from billing.usage_buckets import Query, usage_sums


def spend_by_tenant(*, start: datetime, end: datetime) -> dict[int, int]:
    """tenant id -> cost (femto-USD) of [start, end); `start` on a UTC day (billing.usage_buckets' day buckets:
    whole days from the daily rollup, then its hours, then the records after its end)."""
    sums = usage_sums(Query(tenant=None, start=start, end=end, width="1d", group_by=("tenant_id",),
                            figures=("cost_femtos",)))
    totals: dict[int, int] = defaultdict(int)
    for groups in sums.values():
        for (tenant_id,), figures in groups.items():
            totals[tenant_id] += figures["cost_femtos"]
    return dict(totals)


def requests_since(*, since: datetime) -> int:
    """Requests that ended from `since` on (every outcome)."""
    return UsageRecord.objects.filter(created_at__gte=since).count()


def worker_errors_since(*, since: datetime) -> int:
    """Requests that ended in a worker error from `since` on."""
    return UsageRecord.objects.filter(created_at__gte=since, finish_reason=UsageRecord.FinishReason.ERROR).count()


def ttft_since(*, since: datetime) -> tuple[float | None, float | None]:
    """TTFT p50 and p95 (seconds) of the requests that ended from `since` on."""
    return ttft_percentiles(UsageRecord.objects.filter(created_at__gte=since))
