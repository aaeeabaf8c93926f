"""Budget alert thresholds per counter scope: the tenant's own, else the platform's, kept a minute per process."""

from __future__ import annotations

from common.cache import TtlCache
from tenants.services.limits import LimitScope

ALERT_PERCENTS_TTL_S = 60  # a tenant's new alert thresholds reach every worker within a minute

_alert_percents: TtlCache[LimitScope, tuple[int, ...]] = TtlCache("budget alert thresholds per counter scope",
                                                           ttl=ALERT_PERCENTS_TTL_S, max_entries=100_000)


def alert_percents(scope: LimitScope) -> tuple[int, ...]:
    """The budget alert thresholds of a counter's scope (a tenant, or a key: its tenant's): the tenant's own
    (set by its owners on the dashboard), else the platform's BUDGET_ALERT_PERCENTS. Kept ALERT_PERCENTS_TTL_S."""

    def load() -> tuple[int, ...]:
        from django.conf import settings

        from billing.models import TenantBudget

        if scope.is_key:
            rows = TenantBudget.objects.filter(tenant__api_keys__pk=scope.id)
        else:
            rows = TenantBudget.objects.filter(tenant_id=scope.id)
        own = rows.values_list("budget_alert_percents", flat=True).first()
        return tuple(sorted(own or settings.BUDGET_ALERT_PERCENTS))

    if not isinstance(scope, LimitScope):
        raise TypeError(f"a LimitScope, not {scope!r}")
    return _alert_percents.get_or_load(scope, load)


def alert_percents_forget() -> None:
    """Drop this process's thresholds (a tenant's changed; other processes see it within the TTL)."""
    _alert_percents.clear()
