"""A tenant's monthly budgets and budget alert thresholds: billing's, one row per tenant (none: no budget).

Two budgets; the lower one that is set applies (billing.services.budgets.tenant_budget_micros):
the operator's cap (admin, `limits_set --monthly-budget-usd`), which the tenant's owners cannot
change, and the owners' own (dashboard, Limits & budget). Money is integer micro-dollars.
"""

from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models

from tenants.models import Tenant

MAX_ALERT_PERCENT = 1000
MAX_ALERTS = 10


def validate_alert_percents(value) -> None:
    """A list of at most MAX_ALERTS distinct whole percentages, 1..MAX_ALERT_PERCENT (the alerts sort and compare
    them: a string or a float here would fail the settlement's alert check and the overview page)."""
    if not isinstance(value, list) or len(value) > MAX_ALERTS or len(set(value)) != len(value) or not all(
            type(p) is int and 1 <= p <= MAX_ALERT_PERCENT for p in value):
        raise ValidationError(f"A list of at most {MAX_ALERTS} distinct whole percentages from 1 to "
                              f"{MAX_ALERT_PERCENT}, e.g. [50, 80, 100]; empty: the platform's.")


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
    budget_alert_percents = models.JSONField(default=list, blank=True, validators=[validate_alert_percents],
                                             help_text="Empty: the platform's thresholds")

    class Meta:
        verbose_name = "budget"

    def __str__(self) -> str:
        return f"budget of {self.tenant_id}"
