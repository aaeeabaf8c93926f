"""Billing's reads, the only part of billing the dashboard imports (an import-linter contract): invoices,
a tenant's usage per local day and per period, the console's ledger figures, a tenant's budgets and budget
alert thresholds, and the period and money helpers their figures come with (billing.periods, billing.money).
(The owners' budget forms write through billing.services.budgets: the contract's one exception.)"""

from billing.money import femtos_to_usd, usd_str
from billing.periods import Days, Period, day_floor, days_between, month_containing, today_in
from billing.selectors.alerts import alert_percents, alert_percents_forget
from billing.selectors.budgets import (MAX_ALERT_PERCENT, MAX_ALERTS, limits_explain, operator_budget_micros,
                                       own_alert_percents, owner_budget_micros, tenant_budget_micros,
                                       tenant_budget_source)
from billing.selectors.console import requests_since, spend_by_tenant, ttft_since, worker_errors_since
from billing.selectors.invoices import invoice_for_user, invoices_of
from billing.selectors.usage import (admission_used, latency_by_day, models_in, tenant_models, usage_by_day,
                                     usage_by_day_and_model, usage_totals)

__all__ = [
    "MAX_ALERTS", "MAX_ALERT_PERCENT", "Days", "Period", "admission_used", "alert_percents", "alert_percents_forget",
    "day_floor", "days_between", "femtos_to_usd", "invoice_for_user", "invoices_of", "latency_by_day",
    "limits_explain", "models_in", "month_containing",
    "operator_budget_micros", "own_alert_percents", "owner_budget_micros", "requests_since",
    "spend_by_tenant", "tenant_budget_micros", "tenant_budget_source", "tenant_models", "today_in", "ttft_since",
    "usage_by_day", "usage_by_day_and_model", "usage_totals", "usd_str", "worker_errors_since",
]
