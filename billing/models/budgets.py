"""A tenant's monthly budgets and budget alert thresholds: billing's, one row per tenant (none: no budget).

Two budgets; the lower one that is set applies (billing.services.budgets.tenant_budget_micros):
the operator's cap (admin, `limits_set --monthly-budget-usd`), which the tenant's owners cannot
change, and the owners' own (dashboard, Limits & budget). Money is integer micro-dollars.
"""

from django.core.validators import MinValueValidator
from django.db import models

from tenants.models import Tenant


class TenantBudget(models.Model):
    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, primary_key=True, related_name="budget")
    # The operator's cap: the tenant's owners cannot change it.
    monthly_spend_limit_micros = models.BigIntegerField(
        default=0, validators=[MinValueValidator(0)],
        help_text="Operator's monthly budget cap, micro-dollars; 0 means none")
    # The tenant's own budget, which its owners set on the dashboard (Limits & budget).
    owner_spend_limit_micros = models.BigIntegerField(
        default=0, validators=[MinValueValidator(0)],
        help_text="The tenant owners' own monthly budget (dashboard), micro-dollars; 0 means none")
    # Percentages of the monthly budget at which the owners are e-mailed (empty: BUDGET_ALERT_PERCENTS).
    budget_alert_percents = models.JSONField(default=list, blank=True, help_text="Empty: the platform's thresholds")

    class Meta:
        verbose_name = "budget"

    def __str__(self) -> str:
        return f"budget of {self.tenant_id}"
