"""The ledger behind the period counters: rebuilding them, what a finished request used, budget alerts.

The ledger's sums are billing.ledger's (`ledger_totals`, the charged filter, the clamp); the budget alerts'
thresholds are billing.selectors.alerts'.

Redis (or the in-process backend) is a cache of the ledger, never the truth.
A missing counter is rebuilt before anything is admitted on it: the period's
usage records (PostgreSQL) plus the reservations still open on it. The open
reservations are read first, then the ledger: a request settling in between
is then counted twice (its reservation and its record), never zero times,
until the counter is next rebuilt, so a rebuild can only err on the safe side.
A Redis flush also loses the open reservations of requests in flight: their
records count from the next rebuild on (each period's counter expires a week
after the period ends), so a flush forgets at most what was in flight.

Units match the admission plan: quota counters hold tokens (prompt plus
completion of every charged request), spend counters nano-dollars, each
request's cost rounded up to a whole nano-dollar (so the counter is never
below the ledger).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime

from billing.admission.base import SPEND, Actual, CounterAfter
from billing.ledger import cached_clamp, is_charged, ledger_totals
from billing.money import Cost
from billing.selectors.alerts import alert_percents
from billing.services.costs import usage_cost

logger = logging.getLogger(__name__)

FEMTOS_PER_NANO = 1_000_000


def femtos_to_nanos(femtos: int) -> int:
    return -(-int(femtos) // FEMTOS_PER_NANO)


@dataclass(frozen=True, slots=True)
class CounterRef:
    """What a counter key names: its scope (tenant or key), period and kind."""

    scope: str  # "t<tenant id>" or "k<api key id>"
    period: str  # "YYYY-MM" in the tenant's zone
    kind: str

    @classmethod
    def parse(cls, key: str) -> "CounterRef":
        *_, scope, period, kind = key.split(":")
        return cls(scope=scope, period=period, kind=kind)


def ledger_total(*, scope: str, kind: str, start: datetime, end: datetime) -> int:
    """The period's settled usage of one scope from the usage records (tokens, or nano-dollars)."""
    return ledger_totals(scope=scope, kinds=(kind,), start=start, end=end)[kind]


def counter_rebuild(*, backend, key: str, start: datetime, end: datetime, ttl_s: int) -> bool:
    """Seed a missing counter from the ledger plus its open reservations (False: another process did)."""
    ref = CounterRef.parse(key)
    reserved = backend.open_reserved(key)  # first: see the module's docstring
    value = ledger_total(scope=ref.scope, kind=ref.kind, start=start, end=end) + reserved
    seeded = backend.counter_seed(key, value, ttl_s)
    if seeded:
        logger.info("admission counter %s rebuilt from the ledger: %d (%d reserved)", key, value, reserved)
    return seeded


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
                snapshot=snapshot or pricing_snapshot(),
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
                  spend=femtos_to_nanos(cost.total), at=created.timestamp() if isinstance(created, datetime) else 0.0)


def budget_alerts_check(*, backend, after: list[CounterAfter], ttl_s: int,
                        percents_of: Callable[[str], Iterable[int]] = alert_percents) -> list[tuple]:
    """Mark each budget threshold a settlement crossed, once per period; (scope, period, percent) to e-mail.

    The thresholds are the counter's tenant's (`percents_of(scope)`)."""
    due = []
    for counter in after:
        if counter.kind != SPEND or counter.limit <= 0:
            continue
        used_percent = counter.value * 100 / counter.limit
        ref = CounterRef.parse(counter.key)
        crossed = [p for p in percents_of(ref.scope) if used_percent >= p]
        newly = [p for p in crossed if backend.alert_mark(f"{counter.key}:alert:{p}", ttl_s)]
        if newly:
            due.append((ref.scope, ref.period, max(newly), counter.value, counter.limit))
    return due


def budget_alert_send(*, scope: str, period: str, percent: int, used_nanos: int, limit_nanos: int) -> int:
    """E-mail the owners of the tenant (of the key) that `percent` of the budget is used; how many were sent."""
    from django.conf import settings
    from django.core.mail import send_mail

    from billing.admission.headers import nanos_usd
    from tenants.models import ApiKey, Membership, Tenant

    if scope.startswith("k"):
        key = ApiKey.objects.select_related("tenant").filter(pk=int(scope[1:])).first()
        if key is None:
            return 0
        tenant, what = key.tenant, f"the API key {key.name} ({key.redacted}) of {key.tenant.name}"
    else:
        tenant = Tenant.objects.filter(pk=int(scope[1:])).first()
        if tenant is None:
            return 0
        what = tenant.name
    owners = list(Membership.objects.filter(tenant=tenant, role=Membership.Role.OWNER)
                  .exclude(user__email="").values_list("user__email", flat=True))
    if not owners:
        return 0
    subject = f"Budget alert: {what} has used {percent}% of its {period} budget"
    body = (f"{what} has used ${nanos_usd(used_nanos)} of its monthly budget of ${nanos_usd(limit_nanos)} for {period} "
            f"(in flight requests counted at their worst case).\n")
    if percent >= 100:
        body += "New requests are refused with insufficient_quota until the period ends or the budget is raised.\n"
    return send_mail(subject, body, getattr(settings, "DEFAULT_FROM_EMAIL", None), owners)
