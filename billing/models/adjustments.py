"""Corrections to what a tenant owes: new entries with a reason and an operator, never edits."""

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone

from billing.models.femtos import FemtosField
from tenants.models import Tenant


class Adjustment(models.Model):
    class Kind(models.TextChoices):
        CREDIT = "credit", "Credit (the tenant owes less)"
        DEBIT = "debit", "Debit (the tenant owes more)"

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="adjustments")
    kind = models.CharField(max_length=6, choices=Kind.choices)
    amount_femtos = FemtosField(validators=[MinValueValidator(1)], help_text="Positive, femto-USD")
    reason = models.TextField()
    operator = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    # The instant that places it in a billing period (default: when it was entered).
    effective_at = models.DateTimeField(default=timezone.now)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["tenant", "effective_at"], name="adjustment_tenant_time")]

    def __str__(self) -> str:
        return f"{self.kind} {self.amount_femtos} femto-USD for {self.tenant}"

    def save(self, *args, **kwargs):
        if self.pk is not None and not self._state.adding:
            raise ValueError("an adjustment is never edited; add another one")
        super().save(*args, **kwargs)

    @property
    def signed_femtos(self) -> int:
        """What it adds to the tenant's bill (a credit is negative)."""
        return self.amount_femtos if self.kind == self.Kind.DEBIT else -self.amount_femtos
