"""The tenant's budget in the admin: billing extends tenants' Tenant and API key admins (tenants knows no billing).

The operator sets the cap where they did, on the tenant's page (the "Budget" inline); the owners' own
budget is shown, not changed (theirs: the dashboard). The list shows the operator's cap; the effective
limits tables include the budget in force. Imported by billing.admin (after tenants.admin: INSTALLED_APPS).
"""

from __future__ import annotations

from django.contrib import admin

from billing.models import TenantBudget
from billing.services import budgets
from tenants.admin import ApiKeyAdmin as TenantsApiKeyAdmin
from tenants.admin import TenantAdmin as TenantsTenantAdmin
from tenants.models import ApiKey, Tenant


class TenantBudgetInline(admin.StackedInline):
    model = TenantBudget
    verbose_name = verbose_name_plural = "budget"
    can_delete = False
    max_num = 1
    fields = ("monthly_spend_limit_micros", "owner_spend_limit_micros", "budget_alert_percents")
    # the owners' own budget and alert thresholds are theirs to set (dashboard, Limits & budget); the operator
    # sets the cap (an inline saving a stale copy of the owners' fields would overwrite their change)
    readonly_fields = ("owner_spend_limit_micros", "budget_alert_percents")


def usd_shown(micros: int) -> str:
    return "none" if not micros else f"${micros // 1_000_000:,}.{micros % 1_000_000 // 10_000:02d}"


class TenantAdmin(TenantsTenantAdmin):
    list_display = (*TenantsTenantAdmin.list_display[:5], "spend_limit_usd", *TenantsTenantAdmin.list_display[5:])
    list_select_related = (*TenantsTenantAdmin.list_select_related, "budget")
    inlines = (TenantBudgetInline, *TenantsTenantAdmin.inlines)
    explain = staticmethod(budgets.limits_explain)

    @admin.display(description="operator's budget cap", ordering="budget__monthly_spend_limit_micros")
    def spend_limit_usd(self, obj):
        return usd_shown(budgets.operator_budget_micros(tenant=obj))


class ApiKeyAdmin(TenantsApiKeyAdmin):
    explain = staticmethod(budgets.limits_explain)


for model, model_admin in ((Tenant, TenantAdmin), (ApiKey, ApiKeyAdmin)):
    if admin.site.is_registered(model):
        admin.site.unregister(model)
    admin.site.register(model, model_admin)
