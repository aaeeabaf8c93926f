"""Usage aggregates per hour and per day, and how far they are filled (Zulip's analytics FillState pattern).

An hour's rows are always replaced as a whole, from the usage records, and a
day's rows as the sum of its hour rows, so refilling is idempotent and a
rebuild equals what it replaced. Days exist so that month-long reads stay
small (31 rows per group instead of 744).
"""

from django.db import models

from billing.models.femtos import FemtosField
from tenants.models import ApiKey, Tenant


class UsageFigures(models.Model):
    """One tenant, API key, model, tier and kind (live or batch) in one UTC bucket: counts and cost (femto-USD)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    api_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    model = models.CharField(max_length=100)
    tier = models.CharField(max_length=40)
    batch = models.BooleanField(default=False, db_default=False,
                                help_text="Batch API lines (billing.ledger.BATCH), else live requests")
    requests = models.BigIntegerField(default=0)
    input_tokens = models.BigIntegerField(default=0, help_text="Uncached prompt tokens")
    cached_input_tokens = models.BigIntegerField(default=0)
    output_tokens = models.BigIntegerField(default=0)
    input_cost_femtos = FemtosField(default=0)
    cached_input_cost_femtos = FemtosField(default=0)
    output_cost_femtos = FemtosField(default=0)
    cost_femtos = FemtosField(default=0)

    class Meta:
        abstract = True


class HourlyUsage(UsageFigures):
    hour = models.DateTimeField(help_text="Start of the UTC hour")

    class Meta:
        indexes = [models.Index(fields=["tenant", "hour"], name="hourly_usage_tenant_hour"),
                   models.Index(fields=["hour"], name="hourly_usage_hour")]

    def __str__(self) -> str:
        return f"{self.tenant_id} {self.model} {self.hour:%Y-%m-%d %H}:00"


class DailyUsage(UsageFigures):
    day = models.DateTimeField(help_text="Start of the UTC day")

    class Meta:
        indexes = [models.Index(fields=["tenant", "day"], name="daily_usage_tenant_day"),
                   models.Index(fields=["day"], name="daily_usage_day")]

    def __str__(self) -> str:
        return f"{self.tenant_id} {self.model} {self.day:%Y-%m-%d}"


class FillState(models.Model):
    """How far the rollups are filled: every hour before `end` is done (and its day summed).

    `last_record_id` is the highest usage record id the last fill saw: a
    record with a higher id in an already filled hour (a late finish) makes
    the next run refill that hour.
    """

    name = models.CharField(max_length=40, unique=True)
    end = models.DateTimeField()
    last_record_id = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.name} filled to {self.end:%Y-%m-%d %H}:00"


class DailyLatency(models.Model):
    """One tenant's closed local day (in the zone it had when built): requests, errors, exact TTFT p50/p95.

    Built by the hourly rollup when it fills past the day's end, rebuilt with
    any hour of the day it refills (billing.services.latency_rollups).
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    timezone = models.CharField(max_length=64)
    day = models.DateField(help_text="The tenant's local date")
    requests = models.BigIntegerField(default=0)
    errors = models.BigIntegerField(default=0)
    ttft_p50_s = models.FloatField(null=True, blank=True)
    ttft_p95_s = models.FloatField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "timezone", "day"], name="daily_latency_unique")]

    def __str__(self) -> str:
        return f"{self.tenant_id} {self.day} ({self.timezone})"
