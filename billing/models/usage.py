"""The usage ledger: exactly one record per request, written for every outcome.

The table keeps the name it had in the tenants app (`tenants_usagerecord`):
the model moved here with billing, its rows did not move.
"""

from django.db import models
from django.utils import timezone

from tenants.models import ApiKey, Tenant


class UsageRecord(models.Model):
    """Exactly one per request (unique request_id); written for every outcome."""

    class FinishReason(models.TextChoices):
        STOP = "stop", "stop"
        LENGTH = "length", "length"
        ABORT = "abort", "abort"
        ERROR = "error", "error"

    request_id = models.CharField(max_length=64, unique=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="usage_records")
    api_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="usage_records")
    model = models.CharField(max_length=100, db_index=True)
    tier = models.CharField(max_length=40)
    endpoint = models.CharField(max_length=40, default="chat.completions")
    prompt_tokens = models.PositiveIntegerField(default=0)
    cached_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    finish_reason = models.CharField(max_length=10, choices=FinishReason.choices)
    error = models.TextField(blank=True, default="")
    queued_s = models.FloatField(default=0)
    ttft_s = models.FloatField(null=True, blank=True)
    duration_s = models.FloatField(default=0)
    worker_id = models.CharField(max_length=100, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        db_table = "tenants_usagerecord"
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["tenant", "created_at"], name="usage_tenant_time")]

    def __str__(self) -> str:
        return self.request_id

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens
