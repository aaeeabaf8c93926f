"""Reserving: what the web calls before it queues a request (and when it gives up on one).

`aadmission_reserve` builds the request's plan (billing.services.admission_plan: the tenant's limits, its
tier's limits for the request's model, on counters of their own, and the key's) and reserves it in one
backend call, one Redis round trip: all of them or none. It returns the `x-ratelimit-*` headers (of the
tightest limit of each kind: a model's own when it binds first), or raises the OpenAI-shaped
refusal (billing.services.admission_responses): 429 `rate_limit_exceeded` with `Retry-After`, 429
`insufficient_quota` (which quota, and when the period ends), or 503 `limits_unavailable` when the counters
cannot be reached: nothing is admitted unchecked (fail closed). A period's counter that is missing is
rebuilt from the ledger first (billing.services.counter_rebuild).

The reservation is then held on the pre-enqueue lease until the job is queued
(billing.services.admission_lease), and settled by the worker (billing.services.admission_settle);
`aadmission_release` gives back a reservation whose request never reached a worker.

A refused request that reached no reservation (an oversize or malformed body) still counts one request
against the requests-per-minute limits of its tenant and key (`aadmission_count_request`): no tokenizing,
one backend call.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from datetime import timezone as dt_timezone

from asgiref.sync import sync_to_async
from django.conf import settings

from billing.counters import AdmissionUnavailable, get_admission_backend
from billing.counters.base import QUOTA, SPEND, Actual, Plan
from billing.counters.keys import CounterKey
from billing.periods import Period
from billing.services.admission_plan import (
    count_only_plan, period_current, plan_build, pricing_snapshot, request_scopes, worst_case_nanos,
)
from billing.services.admission_responses import quota_message, rate_message, ratelimit_headers, retry_after_headers
from billing.services.budgets import abudget_ensure
from common.errors import InsufficientQuota, RateLimited, ServiceUnavailable
from common.live_counts import REFUSALS, count_event
from common.outage import Outage
from tenants.selectors import atier_model_limit
from tenants.services.limits import LimitScope

logger = logging.getLogger(__name__)

MAX_REBUILDS = 3

counters_outage = Outage(logger, "admission counters (Redis)")  # (the lease's renewals report here too)


@dataclass(slots=True)
class Admission:
    request_id: str
    reserved: bool = False  # holds a reservation the worker settles
    headers: dict[str, str] = field(default_factory=dict)
    leased: bool = False  # held on the pre-enqueue lease until `aadmission_confirm` (admission_lease)


def _unavailable(exc: Exception) -> ServiceUnavailable:
    counters_outage.failed(exc)
    return ServiceUnavailable(
        "Rate limits and budgets cannot be checked right now, so no request is admitted. Please retry shortly.",
        code="limits_unavailable", headers={"Retry-After": "5"},
    )


def _scope_label(scope: LimitScope, *, tenant, api_key) -> str:
    if scope.is_tenant_model:  # its own counters: the message says which limit was hit
        return f"tenant {tenant.slug} (its tier's per-model limit)"
    if scope.is_key and api_key is not None:
        if scope != LimitScope.key(api_key.pk):  # a creator's ceiling, which the keys it made share (key_scopes)
            return f"API key {api_key.redacted} (a limit it shares with the key that created it)"
        return f"API key {api_key.redacted}"
    return f"tenant {tenant.slug}"


async def aadmission_reserve(*, auth, request_id: str, model: str, prompt_tokens: int, max_tokens: int,
                             batch: bool = False) -> Admission:
    """Reserve every limit of the request at once, or raise its refusal (see the module docstring); a Batch API
    line (`batch`) reserves its spend at the batch price it is billed at."""
    if not settings.ADMISSION_ENABLED:
        return Admission(request_id=request_id)
    tenant, api_key = auth.tenant, auth.api_key
    await abudget_ensure(tenant)  # no query: the verified-key row brought it (billing.services.budgets)
    # the tier's limits for this model came with the key's row (no query on the hot path: tenants.selectors)
    scopes = request_scopes(auth=auth, model_limit=await atier_model_limit(tier=auth.tier, model=model))
    spend_nanos = None
    if any(limits.monthly_spend_limit_micros for limits in scopes):
        spend_nanos = worst_case_nanos(model=model, tier=auth.tier.name, prompt_tokens=prompt_tokens,
                                       max_tokens=max_tokens, snapshot=await pricing_snapshot(), batch=batch)
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
    counters_outage.ok()
    if decision.admitted:
        return Admission(request_id=request_id, reserved=True, headers=ratelimit_headers(decision.buckets),
                         leased=plan.lease_s > 0)
    refusal = decision.refusal
    count_event(REFUSALS, refusal.kind)
    scope = CounterKey.parse(refusal.key, prefix=backend.prefix).scope
    label = _scope_label(scope, tenant=tenant, api_key=api_key)
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
    from billing.services.counter_rebuild import counter_rebuild

    ttls = {counter.key: counter.ttl_s for counter in plan.counters}
    for key in keys:
        counter_rebuild(backend=backend, key=key, start=period.start, end=period.end, ttl_s=ttls[key])


async def aadmission_count_request(*, auth, request_id: str) -> dict[str, str]:
    """Count one request against the requests-per-minute limits of the tenant and key, reserving nothing (a
    request refused for its body, before it reached admission); its `x-ratelimit-*-requests` headers when it
    fit. Never raises: a bucket already empty, or unreachable counters, count nothing."""
    if not settings.ADMISSION_ENABLED:
        return {}
    backend = get_admission_backend()
    await abudget_ensure(auth.tenant)
    plan = count_only_plan(backend=backend, request_id=request_id, scopes=request_scopes(auth=auth))
    if plan.empty:
        return {}
    try:
        decision = await backend.aadmit(plan)
    except AdmissionUnavailable as exc:
        counters_outage.failed(exc)
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
