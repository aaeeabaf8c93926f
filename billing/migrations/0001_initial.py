"""UsageRecord, moved here from tenants: state only, the table keeps its name and rows."""

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ("tenants", "0002_usagerecord_to_billing"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[],
            state_operations=[
                migrations.CreateModel(
                    name="UsageRecord",
                    fields=[
                        ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                        ("request_id", models.CharField(max_length=64, unique=True)),
                        ("model", models.CharField(db_index=True, max_length=100)),
                        ("tier", models.CharField(max_length=40)),
                        ("endpoint", models.CharField(default="chat.completions", max_length=40)),
                        ("prompt_tokens", models.PositiveIntegerField(default=0)),
                        ("cached_tokens", models.PositiveIntegerField(default=0)),
                        ("completion_tokens", models.PositiveIntegerField(default=0)),
                        ("finish_reason", models.CharField(choices=[("stop", "stop"), ("length", "length"), ("abort", "abort"), ("error", "error")], max_length=10)),
                        ("error", models.TextField(blank=True, default="")),
                        ("queued_s", models.FloatField(default=0)),
                        ("ttft_s", models.FloatField(blank=True, null=True)),
                        ("duration_s", models.FloatField(default=0)),
                        ("worker_id", models.CharField(blank=True, default="", max_length=100)),
                        ("created_at", models.DateTimeField(db_index=True, default=django.utils.timezone.now)),
                        ("api_key", models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name="usage_records", to="tenants.apikey")),
                        ("tenant", models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name="usage_records", to="tenants.tenant")),
                    ],
                    options={
                        "db_table": "tenants_usagerecord",
                        "ordering": ["-created_at"],
                        "indexes": [models.Index(fields=["tenant", "created_at"], name="usage_tenant_time")],
                    },
                ),
            ],
        ),
    ]
