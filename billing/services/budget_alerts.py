"""Budget alerts: which thresholds a settlement took a budget past, and the owners' e-mail.

The thresholds are billing.selectors.alerts' (the tenant's own, else the platform's). Each is marked once
per counter (scope and period) in the counters' backend (`alert_mark`), so an alert goes out once; the
e-mail is sent by the billing.tasks.send_budget_alert task (billing.services.admission_settle queues it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from billing.counters.base import SPEND, CounterAfter
from billing.counters.keys import CounterKey, alert_mark_key
from billing.counters.units import nanos_usd
from billing.selectors.alerts import alert_percents
from tenants.services.limits import LimitScope


def budget_alerts_check(*, backend, after: list[CounterAfter], ttl_s: int,
                        percents_of: Callable[[LimitScope], Iterable[int]] = alert_percents) -> list[tuple]:
    """Mark each budget threshold a settlement crossed, once per period; (scope, period, percent, used nanos,
    limit nanos) to e-mail. The thresholds are the counter's tenant's (`percents_of(scope)`)."""
    due = []
    for counter in after:
        if counter.kind != SPEND or counter.limit <= 0:
            continue
        used_percent = counter.value * 100 / counter.limit
        named = CounterKey.parse(counter.key, prefix=backend.prefix)
        crossed = [p for p in percents_of(named.scope) if used_percent >= p]
        newly = [p for p in crossed if backend.alert_mark(alert_mark_key(counter.key, p), ttl_s)]
        if newly:
            due.append((named.scope, named.period, max(newly), counter.value, counter.limit))
    return due


def budget_alert_send(*, scope: str | LimitScope, period: str, percent: int, used_nanos: int,
                      limit_nanos: int) -> int:
    """E-mail the owners of the tenant (of the key) that `percent` of the budget is used; how many were sent.
    `scope` as the task carries it (its string form) or typed."""
    from django.conf import settings
    from django.core.mail import send_mail

    from tenants.models import ApiKey, Membership, Tenant

    scope = scope if isinstance(scope, LimitScope) else LimitScope.parse(scope)
    if scope.is_key:
        key = ApiKey.objects.select_related("tenant").filter(pk=scope.id).first()
        if key is None:
            return 0
        tenant, what = key.tenant, f"the API key {key.name} ({key.redacted}) of {key.tenant.name}"
    else:
        tenant = Tenant.objects.filter(pk=scope.id).first()
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
