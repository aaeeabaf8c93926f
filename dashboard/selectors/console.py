"""The operator console's figures: the fleet and its queues (heartbeats, depths), traffic, errors,
refusals, time to first token, and (for users with dashboard.view_revenue) revenue and the top
tenants by spend.

Every ledger figure is billing's (billing.selectors): revenue reads the
rollups (days before the rollup's filled day, then its hours) and the records
after the rollup's end, so it is the ledger's integers (femto-USD), in UTC
days and months: the platform's own calendar.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta

from django.utils import timezone

from billing.selectors import (day_floor, month_containing, requests_since, spend_by_tenant, ttft_since, usd_str,
                               worker_errors_since)
from common.live_counts import ERRORS, REFUSALS, event_counts
from inference.models import ServedModel
from inference.queue import get_job_queue
from tenants.models import Tenant, Tier

TOP_TENANTS = 10
RATE_WINDOW_S = 60


def _workers(now: float) -> list[dict]:
    workers = []
    for info in sorted(get_job_queue().live_workers(), key=lambda w: (w.get("model", ""), w.get("worker_id", ""))):
        workers.append({
            "worker_id": info.get("worker_id"), "model": info.get("model"), "device": info.get("device"),
            "status": info.get("status"), "draining": info.get("status") == "draining",
            "running": int(info.get("running") or 0), "waiting": int(info.get("waiting") or 0),
            "kv_usage": round(float(info.get("kv_usage") or 0.0), 4), "tok_s": round(float(info.get("tok_s") or 0), 1),
            "heartbeat_age_s": round(max(0.0, now - float(info.get("ts", now))), 1),
        })
    return workers


def _queues() -> list[dict]:
    queue = get_job_queue()
    tiers = list(Tier.objects.order_by("priority", "name").values_list("name", flat=True))
    rows = []
    for model in ServedModel.objects.filter(enabled=True).order_by("name").values_list("name", flat=True):
        depths = queue.depths(model)
        rows.extend({"model": model, "tier": tier, "depth": int(depths.get(tier, 0))}
                    for tier in sorted(set(tiers) | set(depths), key=lambda t: (t not in tiers, t)))
    return rows


def _ttft_last_hour(since: datetime) -> dict:
    p50, p95 = ttft_since(since=since)
    return {"p50_s": None if p50 is None else round(p50, 4), "p95_s": None if p95 is None else round(p95, 4)}


def console_summary(*, now: datetime | None = None, revenue: bool = True) -> dict:
    """Everything the console shows, JSON-ready (money as exact decimal strings of USD); without `revenue`
    (a user lacking dashboard.view_revenue) no revenue figure or tenant's spend is read or returned."""
    now = now or timezone.now()
    hour_ago = now - timedelta(hours=1)
    recent = requests_since(since=now - timedelta(seconds=RATE_WINDOW_S))
    errors = event_counts(ERRORS)
    worker_errors = worker_errors_since(since=hour_ago)
    if worker_errors:
        errors["worker error (usage records)"] = worker_errors
    summary = {
        "at": now.isoformat(),
        "workers": _workers(time.time()),
        "queues": _queues(),
        "requests_per_s": round(recent / RATE_WINDOW_S, 3),
        "errors_by_code": dict(sorted(errors.items())),
        "refusals_by_kind": dict(sorted(event_counts(REFUSALS).items())),
        "ttft_last_hour": _ttft_last_hour(hour_ago),
    }
    if revenue:
        summary.update(_revenue(now))
    return summary


def _revenue(now: datetime) -> dict:
    month_start = month_containing(instant=now, tz="UTC").start
    month = spend_by_tenant(start=month_start, end=now)
    today = spend_by_tenant(start=day_floor(now), end=now)
    top_ids = sorted(month, key=lambda tenant_id: -month[tenant_id])[:TOP_TENANTS]
    names = dict(Tenant.objects.filter(pk__in=top_ids).values_list("pk", "slug"))
    return {
        "revenue_today_usd": usd_str(sum(today.values())),
        "revenue_month_usd": usd_str(sum(month.values())),
        "top_tenants": [{"tenant_id": tenant_id, "slug": names.get(tenant_id, str(tenant_id)),
                         "spend_usd": usd_str(month[tenant_id])} for tenant_id in top_ids],
    }
