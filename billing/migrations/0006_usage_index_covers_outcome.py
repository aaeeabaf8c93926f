"""The (tenant, created_at) index of the usage records also carries ttft_s and finish_reason, so the
dashboard's per-day latency and error figures are read from the index alone. The new index is built
before the old one goes, so range reads always have one."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("billing", "0005_daily_usage"),
        ("tenants", "0004_limit_overrides"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="usagerecord",
            index=models.Index(fields=["tenant", "created_at", "ttft_s", "finish_reason"],
                               name="usage_tenant_time_outcome"),
        ),
        migrations.RemoveIndex(
            model_name="usagerecord",
            name="usage_tenant_time",
        ),
    ]
