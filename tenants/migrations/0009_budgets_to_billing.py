"""The budget columns leave Tenant once billing's 0011 has copied them into billing.TenantBudget."""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("tenants", "0008_apikey_lineage"),
        ("billing", "0011_tenant_budget"),
    ]

    operations = [
        migrations.RemoveField(model_name="tenant", name="monthly_spend_limit_micros"),
        migrations.RemoveField(model_name="tenant", name="owner_spend_limit_micros"),
        migrations.RemoveField(model_name="tenant", name="budget_alert_percents"),
    ]
