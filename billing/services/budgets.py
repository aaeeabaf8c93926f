"""A tenant's monthly budgets and budget alert thresholds (billing.models.TenantBudget): setting them (reading:
billing.selectors.budgets, re-exported here).

Two budgets: the operator's cap (`monthly_spend_limit_micros`: the admin, `limits_set --monthly-budget-usd`,
`create_tenant --spend-limit-usd`) and the owners' own (`owner_spend_limit_micros`: the dashboard's Limits &
budget); the lower of those that are set applies (`tenant_budget_micros`), so an owner can lower the budget
below the operator's cap but never lift or remove that cap. A tenant without a row has no budget and the
platform's alert thresholds (BUDGET_ALERT_PERCENTS).

No query on the request path: the verified-key rows (tenants.services.api_key_cache) carry the tenant's
budget row, read with the key in the same query (`connect` registers the relation), so admission reads
`tenant.budget` from memory. Freshness, as for a tenant's own columns: every save or delete of a budget
empties that cache here at once and tells the other web processes (tenants.services.key_events), and
forgets this process's alert thresholds (billing.selectors.alerts; other processes: within its TTL).
"""

from __future__ import annotations

from django.db import transaction

from billing.models import TenantBudget
from billing.selectors.budgets import (  # noqa: F401  (the reads, with the writes: one place to import)
    MAX_ALERT_PERCENT, MAX_ALERTS, abudget_ensure, budget_load, budget_loaded, budget_of, limits_explain,
    operator_budget_micros,
    own_alert_percents, owner_budget_micros, tenant_budget_micros, tenant_budget_source, tenant_scope_limits,
)
from tenants.models import Tenant
from tenants.services.limits import LIMIT_FIELDS, LimitSource
from tenants.services.limits import limits_set as _limits_set

BUDGET = "monthly_spend_limit_micros"  # the limit's name (tenants.services.limits.LIMIT_FIELDS)


# ---------------------------------------------------------------- setting
def _budget_field_set(*, tenant, name: str, value) -> TenantBudget:
    """Set one column of the tenant's budget row (made when missing); only that column is written, so a change
    to another one at the same time (the admin, the owners) stays. `tenant.budget` is the saved row after."""
    with transaction.atomic():
        row, _ = TenantBudget.objects.get_or_create(tenant=tenant)
        setattr(row, name, value)
        row.full_clean(exclude=["tenant"])
        row.save(update_fields=[name])
    Tenant.budget.related.set_cached_value(tenant, row)
    return row


def _micros(micros) -> int:
    if micros is None or int(micros) < 0:
        raise ValueError("a budget is a whole number of micro-dollars >= 0 (0: none)")
    return int(micros)


def operator_budget_set(*, tenant, micros: int) -> list[LimitSource]:
    """Set the operator's monthly budget cap (micro-dollars; 0: none); the effective limits after."""
    _budget_field_set(tenant=tenant, name="monthly_spend_limit_micros", value=_micros(micros))
    return limits_explain(tenant=tenant)


def owner_budget_set(*, tenant, micros: int) -> list[LimitSource]:
    """Set the tenant owners' own monthly budget (micro-dollars; 0: none); the operator's cap stays as it is,
    and the lower of the two applies. The effective limits after."""
    _budget_field_set(tenant=tenant, name="owner_spend_limit_micros", value=_micros(micros))
    return limits_explain(tenant=tenant)


def budget_alert_percents_set(*, tenant, percents) -> list[int]:
    """Set the tenant's budget alert thresholds (whole percentages 1..1000; empty: the platform's); sorted, unique."""
    values = sorted({int(p) for p in percents})
    if any(p < 1 or p > MAX_ALERT_PERCENT for p in values) or len(values) > MAX_ALERTS:
        raise ValueError(f"at most {MAX_ALERTS} whole percentages from 1 to {MAX_ALERT_PERCENT}")
    _budget_field_set(tenant=tenant, name="budget_alert_percents", value=values)
    return values


def limits_set(*, tenant, api_key=None, values: dict[str, int], clear: list[str] = ()) -> list[LimitSource]:
    """tenants.services.limits.limits_set, where a tenant's budget (`monthly_spend_limit_micros`: the operator's
    cap; cleared: none) is set here; a key's budget is the key's own column. The effective limits after."""
    values, clear = dict(values), list(clear)
    budget = None
    if api_key is None and (BUDGET in values or BUDGET in clear):
        if BUDGET in values and BUDGET in clear:
            raise ValueError(f"{BUDGET} is both set and cleared")
        budget = _micros(values.pop(BUDGET)) if BUDGET in values else 0
        if BUDGET in clear:
            clear.remove(BUDGET)
    unknown = [name for name in [*values, *clear] if name not in LIMIT_FIELDS]
    if unknown:
        raise ValueError(f"unknown limit {unknown[0]!r}")
    with transaction.atomic():
        _limits_set(tenant=tenant, api_key=api_key, values=values, clear=clear)
        if budget is not None:
            _budget_field_set(tenant=tenant, name=BUDGET, value=budget)
    return limits_explain(tenant=tenant, api_key=api_key)


# ---------------------------------------------------------------- freshness
def _on_budget(sender, instance, **_kwargs) -> None:
    from billing.selectors.alerts import alert_percents_forget
    from tenants.services.key_events import key_event_send

    key_event_send(tenant_id=instance.tenant_id)  # the key rows carry the budget: here at once, others at commit
    alert_percents_forget()


def connect() -> None:
    """The key rows carry the tenant's budget; its saves and deletes reach every web process (billing's ready)."""
    from django.db.models.signals import post_delete, post_save

    from tenants.services.api_keys import key_row_relation_add

    key_row_relation_add("tenant__budget")
    for signal in (post_save, post_delete):
        signal.connect(_on_budget, sender=TenantBudget, dispatch_uid="budgets:TenantBudget")
