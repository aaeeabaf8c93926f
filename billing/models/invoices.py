"""Invoices (one per tenant per period) and credit notes against finalized ones.

A draft is recomputed from the ledger while its period runs; once finalized
(`status`) neither it nor its lines ever change (`save` refuses). A
correction found later (late usage, an adjustment dated in the period) is a
credit note: its own finalized document, pointing at the invoice, whose lines
are the difference (positive when the tenant owes more).

Amounts: each line's exact cost is kept as a decimal string of USD
(`exact_usd`: femto-dollar sums can pass what a 64-bit or SQLite REAL column
holds exactly); the line's amount is that rounded once, to the cent, half to
even (billing.money.cents_round), in integer cents. A document's total is the
sum of its lines' amounts.

Tenants name an invoice by its random `public_id` (`inv_...`), never by its
row id, which would tell how many invoices the platform has issued.
"""

import secrets
import string
from decimal import Decimal

from django.db import models
from django.utils.timezone import now

from billing.models.adjustments import Adjustment
from billing.models.prices import Price
from tenants.models import Tenant

PUBLIC_ID_PREFIX = "inv_"
PUBLIC_ID_PATTERN = r"inv_[A-Za-z0-9]{20}"  # what invoice_public_id_new makes (URLs and the API accept only this)
_PUBLIC_ID_ALPHABET = string.ascii_letters + string.digits


def invoice_public_id_new() -> str:
    """A random public id (`inv_` + 20 letters and digits, 119 bits): tenants never see the row's sequential id."""
    return PUBLIC_ID_PREFIX + "".join(secrets.choice(_PUBLIC_ID_ALPHABET) for _ in range(20))


class Invoice(models.Model):
    class Status(models.TextChoices):
        DRAFT = "draft", "Draft"
        FINALIZED = "finalized", "Finalized"

    class Kind(models.TextChoices):
        INVOICE = "invoice", "Invoice"
        CREDIT_NOTE = "credit_note", "Credit note"

    public_id = models.CharField(max_length=32, unique=True, default=invoice_public_id_new, editable=False,
                                 help_text="The invoice's id in URLs and the API")
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="invoices")
    kind = models.CharField(max_length=12, choices=Kind.choices, default=Kind.INVOICE)
    corrects = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="credit_notes")
    number = models.CharField(max_length=80, unique=True)
    period = models.CharField(max_length=7, help_text="YYYY-MM in the tenant's time zone")
    timezone = models.CharField(max_length=64)
    period_start = models.DateTimeField()
    period_end = models.DateTimeField()
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.DRAFT)
    currency = models.CharField(max_length=3, default="usd")
    total_cents = models.BigIntegerField(default=0)
    created_at = models.DateTimeField(default=now)
    updated_at = models.DateTimeField(default=now)
    finalized_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-period_start", "kind", "number"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "period"], condition=models.Q(kind="invoice"),
                                    name="uniq_invoice_per_period"),
        ]
        indexes = [models.Index(fields=["status", "period_end"], name="invoice_status_end")]

    def __str__(self) -> str:
        return self.number

    @property
    def is_final(self) -> bool:
        return self.status == self.Status.FINALIZED

    @property
    def total(self) -> Decimal:
        return Decimal(self.total_cents).scaleb(-2)

    def save(self, *args, **kwargs):
        if self.pk is not None and not self._state.adding:
            stored = type(self).objects.filter(pk=self.pk).values_list("status", flat=True).first()
            if stored == self.Status.FINALIZED:
                raise ValueError("a finalized invoice never changes; issue a credit note")
        super().save(*args, **kwargs)


class InvoiceLine(models.Model):
    class Kind(models.TextChoices):
        INPUT = "input", "Input tokens (uncached)"
        CACHED_INPUT = "cached_input", "Cached input tokens"
        OUTPUT = "output", "Output tokens"
        ADJUSTMENT = "adjustment", "Adjustment"

    invoice = models.ForeignKey(Invoice, on_delete=models.CASCADE, related_name="lines")
    position = models.PositiveIntegerField(default=0)
    kind = models.CharField(max_length=12, choices=Kind.choices)
    model = models.CharField(max_length=100, blank=True, default="")
    batch = models.BooleanField(default=False, db_default=False,
                                help_text="Batch API lines' usage, at the version's batch price")
    price = models.ForeignKey(Price, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    adjustment = models.ForeignKey(Adjustment, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    price_multiplier = models.DecimalField(max_digits=6, decimal_places=3, default=1)
    description = models.CharField(max_length=300)
    quantity = models.BigIntegerField(default=0, help_text="Tokens (1 for an adjustment)")
    unit_price_per_million = models.CharField(max_length=40, blank=True, default="",
                                              help_text="USD per 1M tokens, tier multiplier applied (exact)")
    exact_usd = models.CharField(max_length=60, help_text="The exact sum of the costs, USD")
    amount_cents = models.BigIntegerField(help_text="exact_usd rounded once to the cent, half to even")

    class Meta:
        ordering = ["invoice", "position"]

    def __str__(self) -> str:
        return self.description

    @property
    def amount(self) -> Decimal:
        return Decimal(self.amount_cents).scaleb(-2)

    def save(self, *args, **kwargs):
        if Invoice.objects.filter(pk=self.invoice_id, status=Invoice.Status.FINALIZED).exists():
            raise ValueError("a finalized invoice's lines never change")
        super().save(*args, **kwargs)
