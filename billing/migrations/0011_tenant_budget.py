"""Budgets move from tenants.Tenant to billing.TenantBudget: create the table, copy every tenant's values.

tenants' 0009 then removes the three columns (it depends on this one). Reversible: going back, tenants'
0009 adds the columns again and this migration copies the rows back before dropping the table.
"""

import django.core.validators
import django.db.models.deletion
from django.db import migrations, models

FIELDS = ("monthly_spend_limit_micros", "owner_spend_limit_micros", "budget_alert_percents")


def copy_to_billing(apps, schema_editor):
    Tenant = apps.get_model("tenants", "Tenant")
    TenantBudget = apps.get_model("billing", "TenantBudget")
    rows = [TenantBudget(tenant_id=tenant["pk"], **{name: tenant[name] for name in FIELDS})
            for tenant in Tenant.objects.values("pk", *FIELDS).iterator()
            if tenant["monthly_spend_limit_micros"] or tenant["owner_spend_limit_micros"]
            or tenant["budget_alert_percents"]]
    TenantBudget.objects.bulk_create(rows, batch_size=1000)


def copy_to_tenants(apps, schema_editor):
    Tenant = apps.get_model("tenants", "Tenant")
    TenantBudget = apps.get_model("billing", "TenantBudget")
    for budget in TenantBudget.objects.values("tenant_id", *FIELDS).iterator():
        Tenant.objects.filter(pk=budget["tenant_id"]).update(**{name: budget[name] for name in FIELDS})


class Migration(migrations.Migration):

    dependencies = [
        ("billing", "0010_invoice_public_id"),
        ("tenants", "0008_apikey_lineage"),
    ]

    operations = [
        migrations.CreateModel(
            name="TenantBudget",
            fields=[
                ("tenant", models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, primary_key=True,
                                                related_name="budget", serialize=False, to="tenants.tenant")),
                ("monthly_spend_limit_micros", models.BigIntegerField(
                    default=0, help_text="Operator's monthly budget cap, micro-dollars; 0 means none",
                    validators=[django.core.validators.MinValueValidator(0)])),
                ("owner_spend_limit_micros", models.BigIntegerField(
                    default=0,
                    help_text="The tenant owners' own monthly budget (dashboard), micro-dollars; 0 means none",
                    validators=[django.core.validators.MinValueValidator(0)])),
                ("budget_alert_percents", models.JSONField(blank=True, default=list,
                                                           help_text="Empty: the platform's thresholds")),
            ],
            options={"verbose_name": "budget"},
        ),
        migrations.RunPython(copy_to_billing, copy_to_tenants),
    ]
