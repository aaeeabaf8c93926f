"""Settling: what the worker calls when requests end, and the sweep of reservations left behind.

`admission_settle_start` (the worker: sent before it writes the usage records and read after, so the
counters' round trip overlaps the insert's) and `admission_settle_records` (the spool's retries, the
reaper) settle each request's reservation to what it used (`record_actual`, in each kind's unit: tokens,
nano-dollars); a settlement that takes a budget past one of its thresholds queues the owners' e-mail
(billing.services.budget_alerts). `reservations_release_stale` settles the reservations nobody settled
(a lost settlement, or a web process that died before the queue: billing.services.admission_lease).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from django.conf import settings

from billing.counters import get_admission_backend
from billing.counters.base import Actual
from billing.counters.units import cost_femtos_to_nanos
from billing.ledger import cached_clamp, is_charged
from billing.money import Cost
from billing.services.costs import usage_cost
from common.outage import Outage

logger = logging.getLogger(__name__)

ALERT_MARK_TTL_S = 40 * 86400  # a budget alert's mark outlives its period

_settle_outage = Outage(logger, "settling reservations: admission counters (Redis)")


def record_actual(record: dict, snapshot=None) -> Actual:
    """What a usage record (its `usage_record_fields` arguments) used, in each kind's unit."""
    prompt, cached = int(record.get("prompt_tokens") or 0), int(record.get("cached_tokens") or 0)
    completion, reason = int(record.get("completion_tokens") or 0), record["finish_reason"]
    cached = cached_clamp(prompt_tokens=prompt, cached_tokens=cached)
    charged = is_charged(finish_reason=reason, completion_tokens=completion)
    costing = record.get("costing")  # the worker's, computed once for the record and the client
    if costing is None:
        from billing.services.costs import instant
        from billing.services.price_cache import PriceUnavailable, pricing_snapshot

        try:
            costing = usage_cost(
                model=record["model"], tier=record["tier"], admitted_at=instant(record.get("admitted_at")),
                prompt_tokens=prompt, cached_tokens=cached, completion_tokens=completion, finish_reason=reason,
                batch=bool(record.get("batch_id")), snapshot=snapshot or pricing_snapshot(),
            )
        except PriceUnavailable as exc:
            # Its reservation is settled now all the same (slot and tokens given back) while its record waits
            # in the worker's spool for the price to be fixed; its spend counts 0 here, so the budget counter
            # misses it until it is next rebuilt from the ledger (logged).
            logger.error("settling %s without its spend: %s", record.get("request_id"), exc.message)
            costing = (None, 1000, Cost())
    cost = costing[2]
    created = record.get("created_at")  # the record's month is the one its counters count it in (billing.periods)
    return Actual(tokens=prompt - cached + completion, quota=prompt + completion if charged else 0,
                  spend=cost_femtos_to_nanos(cost.total),
                  at=created.timestamp() if isinstance(created, datetime) else 0.0)


def admission_settle_records(records: list[dict]) -> bool:
    """Settle the reservations of finished requests (usage-record fields) to what each used. Never raises;
    False when the counters could not be reached (settling again later is safe: a reservation is
    consumed once, a second settlement finds nothing)."""
    return admission_settle_start(records, overlap=False)()


def admission_settle_start(records: list[dict], *, overlap: bool = True) -> Callable[[], bool]:
    """Start settling `records`; the returned function finishes it (`admission_settle_records`' result).

    With `overlap` the counters' call is sent now and its reply read by the returned function
    (`settle_many_start`: on Redis, the script runs while the worker writes the records' usage insert,
    so settling adds next to nothing to it: benchmarks/admission.py --part settle). Everything stays on
    the caller's thread (and its database connection: the records' costs, the alerts' thresholds).
    """
    if not records or not settings.ADMISSION_ENABLED:
        return _settled_true
    backend = get_admission_backend()
    try:
        items = [(record["request_id"], record_actual(record)) for record in records]
        finish = backend.settle_many_start(items) if overlap else (lambda: backend.settle_many(items))
    except Exception as exc:  # noqa: BLE001 - Redis or (prices) PostgreSQL down: the caller settles again later
        _settle_outage.failed(repr(exc))
        return _settled_false

    def wait() -> bool:
        from billing.services.budget_alerts import budget_alerts_check

        try:
            after = finish()
            if after:
                due = budget_alerts_check(backend=backend, after=after, ttl_s=ALERT_MARK_TTL_S)
                for scope, period, percent, used, limit in due:
                    _alert_enqueue(scope=str(scope), period=period, percent=percent, used=used, limit=limit)
        except Exception as exc:  # noqa: BLE001 - Redis down: the caller settles again later
            _settle_outage.failed(repr(exc))
            return False
        _settle_outage.ok()
        return True

    return wait


def _settled_true() -> bool:
    return True


def _settled_false() -> bool:
    return False


def _alert_enqueue(**alert) -> None:
    # by the task's name: billing.tasks (thin) imports the services, never the other way round. The scope
    # travels in its string form (LimitScope: "t12", "k34"); budget_alert_send parses it back.
    from celery import signature

    try:
        signature("billing.tasks.send_budget_alert", kwargs=alert).delay()
    except Exception:  # noqa: BLE001 - an alert must never cost a settlement
        logger.exception("could not queue the budget alert %s", alert)


def reservations_release_stale() -> int:
    """Settle reservations older than the longest request, or whose pre-enqueue lease ran out (their web process
    died before the queue): to their usage record if one exists, else to nothing."""
    from billing.models import UsageRecord

    backend = get_admission_backend()
    stale = backend.stale_reservations()
    if not stale:
        return 0
    records = {r["request_id"]: r for r in UsageRecord.objects.filter(request_id__in=stale).values(
        "request_id", "model", "tier", "prompt_tokens", "cached_tokens", "completion_tokens", "finish_reason",
        "admitted_at", "created_at", "batch_id")}
    settled = [records.get(rid, {"request_id": rid}) for rid in stale]
    found = [r for r in settled if "model" in r]
    admission_settle_records(found)
    for rid in stale:
        if rid not in records:
            backend.settle(rid, Actual())
    logger.warning("released %d stale reservations (%d had a usage record)", len(stale), len(found))
    return len(stale)
