"""Reading a tenant's monthly budgets and alert thresholds (billing.models.TenantBudget; setting them:
billing.services.budgets, whose docstring tells the rules, and how the request path reads none of this
from the database: the verified-key row brings `tenant.budget` with it)."""

from __future__ import annotations

from billing.models import TenantBudget
from billing.models.budgets import MAX_ALERT_PERCENT, MAX_ALERTS  # noqa: F401 - the dashboard's form reads them here
from tenants.models import Tenant
from tenants.services.limits import LimitSource, ScopeLimits, tenant_limits
from tenants.services.limits import limits_explain as _limits_explain

def budget_loaded(tenant) -> bool:
    """Whether `tenant.budget` is in memory (read with the row, or looked up once): reading it queries nothing."""
    return Tenant.budget.is_cached(tenant)


def budget_load(tenant) -> TenantBudget | None:
    """Read the tenant's budget row into `tenant.budget` (one query) unless it is there; the row or None."""
    if not budget_loaded(tenant):
        row = TenantBudget.objects.filter(tenant_id=tenant.pk).first()
        Tenant.budget.related.set_cached_value(tenant, row)
    return budget_of(tenant)


async def abudget_ensure(tenant) -> None:
    """`budget_load` from the event loop; nothing to do (and no hop) when the key row brought it (the rule)."""
    if not budget_loaded(tenant):
        from asgiref.sync import sync_to_async

        await sync_to_async(budget_load)(tenant)  # on the thread the API's other ORM calls share


def budget_of(tenant) -> TenantBudget | None:
    """The tenant's budget row, None when it has none (a query unless loaded: `budget_loaded`)."""
    try:
        return tenant.budget
    except TenantBudget.DoesNotExist:
        return None


def operator_budget_micros(*, tenant) -> int:
    row = budget_of(tenant)
    return int(row.monthly_spend_limit_micros or 0) if row is not None else 0


def owner_budget_micros(*, tenant) -> int:
    row = budget_of(tenant)
    return int(row.owner_spend_limit_micros or 0) if row is not None else 0


def own_alert_percents(*, tenant) -> list[int]:
    """The tenant's own alert thresholds (empty: the platform's)."""
    row = budget_of(tenant)
    return list(row.budget_alert_percents or []) if row is not None else []


def tenant_budget_micros(*, tenant) -> int:
    """The tenant's monthly budget in force: the lower of the operator's cap and the owners' own (0: none)."""
    values = [value for value in (operator_budget_micros(tenant=tenant), owner_budget_micros(tenant=tenant)) if value]
    return min(values, default=0)


def tenant_budget_source(*, tenant) -> str:
    """Which budget is in force: "operator", "owner" or "none" (equal budgets: the operator's)."""
    effective = tenant_budget_micros(tenant=tenant)
    if not effective:
        return "none"
    return "operator" if effective == operator_budget_micros(tenant=tenant) else "owner"


def tenant_scope_limits(*, tenant, tier) -> ScopeLimits:
    """The tenant's ScopeLimits, its budget included (admission: billing.services.admission_plan)."""
    return tenant_limits(tenant=tenant, tier=tier, budget_micros=tenant_budget_micros(tenant=tenant))


def limits_explain(*, tenant, api_key=None) -> list[LimitSource]:
    """tenants.services.limits.limits_explain with the tenant's budget (billing's) filled in."""
    return _limits_explain(tenant=tenant, api_key=api_key, budget_micros=tenant_budget_micros(tenant=tenant),
                           budget_source=tenant_budget_source(tenant=tenant))
