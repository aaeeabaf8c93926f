"""Admission: what the web calls before it queues a request, and what the worker calls when it ends.

`aadmission_reserve` builds the request's plan (every limit that applies:
tenants.services.limits) and reserves it in one backend call, one Redis round
trip: requests and tokens per minute (tokens: the prompt plus `max_tokens`),
a concurrency slot, the period's token quota and budget (the worst-case cost:
every prompt token at the uncached input price plus `max_tokens` at the
output price, tier multiplier included). It returns the `x-ratelimit-*`
headers, or raises the OpenAI-shaped refusal: 429 `rate_limit_exceeded` with
`Retry-After`, 429 `insufficient_quota` (which quota, and when the period
ends), or 503 `limits_unavailable` when the counters cannot be reached:
nothing is admitted unchecked (fail closed).

`admission_settle_start` (the worker: sent before it writes the usage
records and read after, so the counters' round trip overlaps the insert's)
and `admission_settle_records` (the spool's retries, the reaper) settle each
request's reservation to what it used; `admission_release` gives back a
reservation whose request never reached a worker.

Between admission and the queue a reservation is held on a lease of
ADMISSION_LEASE_S seconds, renewed by the web process (`AdmissionLease`)
until the job is queued (`aadmission_confirm`), then up to ADMISSION_HOLD_S as
before: a web process killed in between stops renewing, its request's
concurrency slots are free within ADMISSION_LEASE_S, and the stale sweep
gives back the rest (billing.admission.base).

A refused request that reached no reservation (an oversize or malformed
body) still counts one request against the requests-per-minute limits of its
tenant and key (`aadmission_count_request`): no tokenizing, one backend call.

Months: quota and budget counters count a request in the month its usage
record is dated (`created_at`), as invoices do: the rule is in billing.periods.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from datetime import timezone as dt_timezone

from asgiref.sync import sync_to_async
from django.conf import settings

from billing.admission import AdmissionUnavailable, get_admission_backend
from billing.admission.base import QUOTA, REQUESTS, SPEND, TOKENS, Actual, Bucket, Counter, Plan, Slot
from billing.admission.headers import quota_message, rate_message, ratelimit_headers, retry_after_headers
from billing.periods import Period, month_containing, period_after
from tenants.services.limits import ScopeLimits, key_scopes, tenant_limits
from common.errors import InsufficientQuota, RateLimited, ServiceUnavailable
from common.outage import Outage
from common.live_counts import REFUSALS, count_event

logger = logging.getLogger(__name__)

COUNTER_MARGIN_S = 7 * 86400  # a period's counters outlive it: late settlements still find them
MAX_REBUILDS = 3


@dataclass(slots=True)
class Admission:
    request_id: str
    reserved: bool = False  # holds a reservation the worker settles
    headers: dict[str, str] = field(default_factory=dict)
    leased: bool = False  # held on the pre-enqueue lease until `aadmission_confirm`


# ---------------------------------------------------------------- periods
_periods: dict[str, Period] = {}  # time zone -> its current month (until its end)


def period_current(*, tz: str) -> Period:
    """The tenant's current month (billing.periods), computed once per zone and month."""
    now = datetime.now(dt_timezone.utc)
    period = _periods.get(tz)
    if period is None or not period.contains(now):
        period = _periods[tz] = month_containing(instant=now, tz=tz)
    return period


# ---------------------------------------------------------------- the plan
def _worst_case_nanos(*, model: str, tier: str, prompt_tokens: int, max_tokens: int, snapshot) -> int:
    from billing.money import cost_compute
    from billing.services.admission_ledger import femtos_to_nanos

    terms = snapshot.terms_at(model, datetime.now(dt_timezone.utc))
    cost = cost_compute(terms=terms, multiplier_milli=snapshot.multiplier_milli(tier), prompt_tokens=prompt_tokens,
                        cached_tokens=0, completion_tokens=max_tokens)
    return femtos_to_nanos(cost.total)


def plan_build(*, backend, request_id: str, scopes: list[ScopeLimits], prompt_tokens: int, max_tokens: int,
               period: Period, spend_nanos: int | None, now: datetime | None = None) -> Plan:
    """Every limit of `scopes` that is set (non-zero), in one plan."""
    now = now or datetime.now(dt_timezone.utc)
    tokens = prompt_tokens + max_tokens
    ttl = max(1, int((period.end - now).total_seconds()) + COUNTER_MARGIN_S)
    following = _period_after(period)
    buckets, slots, counters = [], [], []
    for limits in scopes:
        if limits.requests_per_minute:
            buckets.append(Bucket(backend.key("rb", limits.scope, REQUESTS), REQUESTS, limits.requests_per_minute, 1))
        if limits.tokens_per_minute:
            buckets.append(Bucket(backend.key("rb", limits.scope, TOKENS), TOKENS, limits.tokens_per_minute, tokens))
        if limits.max_concurrent_requests:
            slots.append(Slot(backend.key("cc", limits.scope), limits.max_concurrent_requests))
        if limits.monthly_token_quota:
            counters.append(Counter(backend.key("q", limits.scope, period.label, QUOTA), QUOTA,
                                    limits.monthly_token_quota, tokens, ttl,
                                    next_key=backend.key("q", limits.scope, following.label, QUOTA)))
        if limits.monthly_spend_limit_micros and spend_nanos is not None:
            counters.append(Counter(backend.key("q", limits.scope, period.label, SPEND), SPEND,
                                    limits.monthly_spend_limit_micros * 1000, spend_nanos, ttl,
                                    next_key=backend.key("q", limits.scope, following.label, SPEND)))
    return Plan(request_id=request_id, buckets=tuple(buckets), slots=tuple(slots), counters=tuple(counters),
                hold_s=settings.ADMISSION_HOLD_S, lease_s=settings.ADMISSION_LEASE_S,
                period_end=period.end.timestamp())


_following: dict[Period, Period] = {}  # a period -> the next one (a few per zone and month)


def _period_after(period: Period) -> Period:
    following = _following.get(period)
    if following is None:
        if len(_following) > 4096:
            _following.clear()
        following = _following[period] = period_after(period)
    return following


async def _pricing_snapshot():
    """The process's price snapshot; only a reload (once per PRICE_CACHE_TTL_S) leaves the event loop."""
    from billing.services import price_cache

    snapshot = price_cache.pricing_snapshot_fresh()
    if snapshot is not None:
        return snapshot
    return await sync_to_async(price_cache.pricing_snapshot)()


# ---------------------------------------------------------------- web side
_counters_outage = Outage(logger, "admission counters (Redis)")
_settle_outage = Outage(logger, "settling reservations: admission counters (Redis)")


def _unavailable(exc: Exception) -> ServiceUnavailable:
    _counters_outage.failed(exc)
    return ServiceUnavailable(
        "Rate limits and budgets cannot be checked right now, so no request is admitted. Please retry shortly.",
        code="limits_unavailable", headers={"Retry-After": "5"},
    )


# where a refused key names its scope: P:rb:SCOPE:kind, P:cc:SCOPE, P:q:SCOPE:period:kind
_SCOPE_AT = {
    REQUESTS: lambda key: key.split(":")[-2], TOKENS: lambda key: key.split(":")[-2],
    "concurrency": lambda key: key.split(":")[-1],
    QUOTA: lambda key: key.split(":")[-3], SPEND: lambda key: key.split(":")[-3],
}


def _scope_label(scope: str, *, tenant, api_key) -> str:
    if scope.startswith("k") and api_key is not None:
        if scope != f"k{api_key.pk}":  # a creator's ceiling, which the keys it made share (limits.key_scopes)
            return f"API key {api_key.redacted} (a limit it shares with the key that created it)"
        return f"API key {api_key.redacted}"
    return f"tenant {tenant.slug}"


async def aadmission_reserve(*, auth, request_id: str, model: str, prompt_tokens: int, max_tokens: int) -> Admission:
    """Reserve every limit of the request at once, or raise its refusal (see the module docstring)."""
    if not settings.ADMISSION_ENABLED:
        return Admission(request_id=request_id)
    tenant, api_key = auth.tenant, auth.api_key
    scopes = [tenant_limits(tenant=tenant, tier=auth.tier), *key_scopes(api_key=api_key)]
    spend_nanos = None
    if any(limits.monthly_spend_limit_micros for limits in scopes):
        spend_nanos = _worst_case_nanos(model=model, tier=auth.tier.name, prompt_tokens=prompt_tokens,
                                        max_tokens=max_tokens, snapshot=await _pricing_snapshot())
    backend = get_admission_backend()
    period = period_current(tz=tenant.timezone or "UTC")
    plan = plan_build(backend=backend, request_id=request_id, scopes=scopes, prompt_tokens=prompt_tokens,
                      max_tokens=max_tokens, period=period, spend_nanos=spend_nanos)
    if plan.empty:
        return Admission(request_id=request_id)
    try:
        for _ in range(MAX_REBUILDS):
            decision = await backend.aadmit(plan)
            if not decision.missing:
                break
            # on the thread the API's other ORM calls share (inference.api.asgi)
            await sync_to_async(_counters_rebuild)(backend=backend, keys=decision.missing, plan=plan, period=period)
        else:
            raise AdmissionUnavailable(f"counters {decision.missing} missing after {MAX_REBUILDS} rebuilds")
    except AdmissionUnavailable as exc:
        raise _unavailable(exc) from exc
    _counters_outage.ok()
    if decision.admitted:
        return Admission(request_id=request_id, reserved=True, headers=ratelimit_headers(decision.buckets),
                         leased=plan.lease_s > 0)
    refusal = decision.refusal
    count_event(REFUSALS, refusal.kind)
    label = _scope_label(_SCOPE_AT[refusal.kind](refusal.key), tenant=tenant, api_key=api_key)
    if refusal.kind in (QUOTA, SPEND):
        end = period.end.astimezone(_zone(period.tz)).isoformat()
        wait = (period.end - datetime.now(dt_timezone.utc)).total_seconds()
        raise InsufficientQuota(quota_message(refusal=refusal, scope_label=label, period_label=period.label,
                                              period_end=end), headers=retry_after_headers(wait))
    raise RateLimited(rate_message(refusal=refusal, model=model, scope_label=label),
                      headers=retry_after_headers(refusal.retry_after_s or 1.0))


def _zone(tz: str):
    import zoneinfo

    return zoneinfo.ZoneInfo(tz)


def _counters_rebuild(*, backend, keys: list[str], plan: Plan, period: Period) -> None:
    from billing.services.admission_ledger import counter_rebuild

    ttls = {counter.key: counter.ttl_s for counter in plan.counters}
    for key in keys:
        counter_rebuild(backend=backend, key=key, start=period.start, end=period.end, ttl_s=ttls[key])


class AdmissionLease:
    """The web side of the pre-enqueue lease: renews it every third of ADMISSION_LEASE_S while the request is
    in this process's hands before it is queued (`async with AdmissionLease(admission):` around the enqueue).

    The renewal is a background task that sleeps first: an enqueue takes milliseconds, so normally it never
    renews at all and costs one task. If this process dies, nothing renews: the request's concurrency slots
    are free once the lease runs out, and the stale sweep gives back its quota and budget.
    """

    def __init__(self, admission: Admission | None) -> None:
        self.admission = admission
        self._task = None

    async def __aenter__(self) -> "AdmissionLease":
        if self.admission is not None and self.admission.leased:
            self._task = asyncio.create_task(self._renew(self.admission.request_id))
        return self

    async def __aexit__(self, *exc_info) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    @staticmethod
    async def _renew(request_id: str) -> None:
        lease_s = float(settings.ADMISSION_LEASE_S)
        backend = get_admission_backend()
        while True:
            await asyncio.sleep(lease_s / 3)
            try:
                if not await backend.aextend([request_id], lease_s):
                    logger.warning("the admission lease of %s ran out before its job was queued", request_id)
                    return
            except AdmissionUnavailable as exc:
                _counters_outage.failed(exc)


_confirmations: set = set()  # the confirmations in flight (the event loop keeps only weak references to tasks)


async def aadmission_confirm(*, admission: Admission | None, wait: bool = False) -> None:
    """The request's job is on the queue: end its pre-enqueue lease, hold its reservation up to ADMISSION_HOLD_S
    (the worker or the reaper settles it). Sent to Redis in the background unless `wait`: nothing the client
    waits for depends on it, and it has the lease's seconds to land."""
    if admission is None or not admission.leased:
        return
    admission.leased = False
    if wait or get_admission_backend().in_process:
        await _confirm(admission.request_id)
        return
    task = asyncio.create_task(_confirm(admission.request_id))
    _confirmations.add(task)
    task.add_done_callback(_confirmations.discard)


async def _confirm(request_id: str) -> None:
    backend = get_admission_backend()
    for attempt in range(3):
        try:
            if not await backend.aconfirm(request_id):  # settled already (a request that ended at once), or
                # its lease ran out before the enqueue and the sweep released it: the worker's settlement of
                # it finds nothing, and its usage counts from the next rebuild of the counters
                logger.info("no reservation of %s left to confirm", request_id)
            return
        except AdmissionUnavailable as exc:
            _counters_outage.failed(exc)
            await asyncio.sleep(0.2 * (attempt + 1))


async def aadmission_count_request(*, auth, request_id: str) -> dict[str, str]:
    """Count one request against the requests-per-minute limits of the tenant and key, reserving nothing (a
    request refused for its body, before it reached admission); its `x-ratelimit-*-requests` headers when it
    fit. Never raises: a bucket already empty, or unreachable counters, count nothing."""
    if not settings.ADMISSION_ENABLED:
        return {}
    scopes = [tenant_limits(tenant=auth.tenant, tier=auth.tier), *key_scopes(api_key=auth.api_key)]
    backend = get_admission_backend()
    buckets = tuple(Bucket(backend.key("rb", limits.scope, REQUESTS), REQUESTS, limits.requests_per_minute, 1)
                    for limits in scopes if limits.requests_per_minute)
    if not buckets:
        return {}
    try:
        decision = await backend.aadmit(Plan(request_id=request_id, buckets=buckets, count_only=True))
    except AdmissionUnavailable as exc:
        _counters_outage.failed(exc)
        return {}
    return ratelimit_headers(decision.buckets) if decision.admitted else {}


async def aadmission_release(*, admission: Admission | None) -> None:
    """Give back everything a request reserved that never reached a worker (nothing was used)."""
    if admission is None or not admission.reserved:
        return
    admission.reserved = False
    try:
        await get_admission_backend().asettle(admission.request_id, Actual())
    except AdmissionUnavailable:
        logger.warning("could not release the reservation of %s; the stale sweep will", admission.request_id)


# ---------------------------------------------------------------- worker side
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
    from billing.services.admission_ledger import record_actual

    backend = get_admission_backend()
    try:
        items = [(record["request_id"], record_actual(record)) for record in records]
        finish = backend.settle_many_start(items) if overlap else (lambda: backend.settle_many(items))
    except Exception as exc:  # noqa: BLE001 - Redis or (prices) PostgreSQL down: the caller settles again later
        _settle_outage.failed(repr(exc))
        return _settled_false

    def wait() -> bool:
        from billing.services.admission_ledger import budget_alerts_check

        try:
            after = finish()
            if after:
                due = budget_alerts_check(backend=backend, after=after, ttl_s=40 * 86400)
                for scope, period, percent, used, limit in due:
                    _alert_enqueue(scope=scope, period=period, percent=percent, used=used, limit=limit)
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
    # by the task's name: billing.tasks (thin) imports the services, never the other way round
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
        "admitted_at", "created_at")}
    settled = [records.get(rid, {"request_id": rid}) for rid in stale]
    found = [r for r in settled if "model" in r]
    admission_settle_records(found)
    for rid in stale:
        if rid not in records:
            backend.settle(rid, Actual())
    logger.warning("released %d stale reservations (%d had a usage record)", len(stale), len(found))
    return len(stale)
