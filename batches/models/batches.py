"""Batches (`/v1/batches`) and their lines.

A batch moves through OpenAI's states, only by batches.services.transitions (a conditional UPDATE: two
processes cannot both move one batch). Its input file's requests become `BatchLine` rows once validated,
one per `custom_id` (unique in the batch): what the runner claims, runs once and bills once.
"""

import secrets
import string

from django.db import models
from django.utils.timezone import now

from batches.models.files import StoredFile
from tenants.models import ApiKey, Tenant

PUBLIC_ID_PREFIX = "batch_"
_ALPHABET = string.ascii_letters + string.digits
ENDPOINTS = ("/v1/chat/completions", "/v1/completions")
COMPLETION_WINDOWS = ("24h",)


def batch_public_id_new() -> str:
    """`batch_` + 24 letters and digits (142 bits)."""
    return PUBLIC_ID_PREFIX + "".join(secrets.choice(_ALPHABET) for _ in range(24))


class Batch(models.Model):
    class Status(models.TextChoices):
        VALIDATING = "validating", "Validating"
        FAILED = "failed", "Failed"
        IN_PROGRESS = "in_progress", "In progress"
        FINALIZING = "finalizing", "Finalizing"
        COMPLETED = "completed", "Completed"
        EXPIRED = "expired", "Expired"
        CANCELLING = "cancelling", "Cancelling"
        CANCELLED = "cancelled", "Cancelled"

    public_id = models.CharField(max_length=40, unique=True, default=batch_public_id_new, editable=False,
                                 help_text="The batch's id in URLs and the API")
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="batches")
    api_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
                                help_text="The key that created the batch: its lines are that key's usage")
    endpoint = models.CharField(max_length=40, choices=[(e, e) for e in ENDPOINTS])
    completion_window = models.CharField(max_length=8, default="24h")
    model = models.CharField(max_length=100, blank=True, help_text="Every line's model (set once validated)")
    input_file = models.ForeignKey(StoredFile, on_delete=models.PROTECT, related_name="+")
    output_file = models.ForeignKey(StoredFile, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    error_file = models.ForeignKey(StoredFile, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.VALIDATING)
    errors = models.JSONField(null=True, blank=True, help_text="Validation errors: [{code, message, param, line}]")
    metadata = models.JSONField(null=True, blank=True)
    total = models.PositiveIntegerField(default=0)
    completed = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    input_tokens = models.PositiveBigIntegerField(
        default=0, help_text="Its lines' prompt tokens, counted at validation: what it holds of the tenant's batch "
                             "queue for its model while unfinished (tenants.Tier.batch_queue_tokens)")
    created_at = models.DateTimeField(default=now)
    expires_at = models.DateTimeField()
    in_progress_at = models.DateTimeField(null=True, blank=True)
    finalizing_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    failed_at = models.DateTimeField(null=True, blank=True)
    expired_at = models.DateTimeField(null=True, blank=True)
    cancelling_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "batches"
        indexes = [models.Index(fields=["tenant", "created_at", "id"], name="batch_tenant_created"),
                   models.Index(fields=["status", "expires_at"], name="batch_status_expires")]

    def __str__(self) -> str:
        return f"{self.public_id} ({self.status})"


class BatchLine(models.Model):
    """One request of a batch: `custom_id` unique in it, `body` as validated, then its outcome."""

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        RUNNING = "running", "Running"
        COMPLETED = "completed", "Completed"
        FAILED = "failed", "Failed"
        EXPIRED = "expired", "Expired"
        CANCELLED = "cancelled", "Cancelled"

    batch = models.ForeignKey(Batch, on_delete=models.CASCADE, related_name="lines")
    line_no = models.PositiveIntegerField(help_text="1-based line number in the input file")
    custom_id = models.CharField(max_length=512)
    # the body as JSON text (json.dumps of what was validated), not a JSONField: PostgreSQL's jsonb refuses the
    # \u0000 a prompt may hold, which a live request can carry
    body = models.TextField(help_text="The request's body, JSON text")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    claimed_by = models.CharField(max_length=100, blank=True, help_text="The runner that holds it while running")
    claimed_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveSmallIntegerField(default=0)
    request_id = models.CharField(max_length=64, blank=True, help_text="Its request's id: usage record, billing")
    response_status = models.PositiveSmallIntegerField(null=True, blank=True)
    response_body = models.TextField(blank=True, help_text="The response's body, JSON text (a completion may hold "
                                     "the \\u0000 that jsonb refuses)")
    error = models.JSONField(null=True, blank=True, help_text="{code, message}: a line that did not run")
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["batch", "custom_id"], name="batch_line_custom_id_unique"),
            models.UniqueConstraint(fields=["batch", "line_no"], name="batch_line_no_unique"),
        ]
        indexes = [models.Index(fields=["batch", "status", "line_no"], name="batch_line_status")]

    def __str__(self) -> str:
        return f"{self.batch_id}:{self.custom_id}"

    def request_body(self) -> dict:
        import json

        return json.loads(self.body)
