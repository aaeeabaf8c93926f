"""Versioned prices: one row per served model and `effective_from`, never edited in place, retired not deleted."""

from decimal import Decimal

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator
from django.db import models
from django.utils import timezone

from billing.money import (
    DEFAULT_BATCH_DISCOUNT_PERCENT,
    MAX_PRICE_PER_MILLION,
    PRICE_PLACES,
    PriceTerms,
    batch_discount_check,
    batch_per_million,
    batch_terms,
    per_million_to_picos,
    price_check,
)

PRICE_FIELDS = ("input_per_million", "cached_input_per_million", "output_per_million")


def _price_field(label: str) -> models.DecimalField:
    # The column holds up to 999,999.999999; price_check (clean) bounds a price at MAX_PRICE_PER_MILLION.
    return models.DecimalField(
        max_digits=12, decimal_places=PRICE_PLACES,
        help_text=f"USD per 1M {label} tokens: 0 to {MAX_PRICE_PER_MILLION}, up to {PRICE_PLACES} decimal places",
    )


class Price(models.Model):
    """The price of a served model from `effective_from` until the next version of the same model.

    A correction is a new version: a saved row never changes (`save` refuses),
    so every usage record's `price` still explains its cost. A version set by
    mistake is retired (`retired_at`, billing.services.prices.price_retire):
    it stays, with the records it priced, but prices nothing after that
    (the version before it applies again).
    """

    model = models.CharField(max_length=100, help_text="Served model name, as requests name it")
    input_per_million = _price_field("uncached input")
    cached_input_per_million = _price_field("cached input (prefix-cache hits)")
    output_per_million = _price_field("output")
    batch_discount_percent = models.PositiveSmallIntegerField(
        default=DEFAULT_BATCH_DISCOUNT_PERCENT, db_default=DEFAULT_BATCH_DISCOUNT_PERCENT,
        validators=[MaxValueValidator(100)],
        help_text="Batch API lines (/v1/batches) pay every kind of token this whole percent less "
                  "(0 to 100; billing.money.batch_terms)",
    )
    effective_from = models.DateTimeField()
    created_at = models.DateTimeField(default=timezone.now)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    note = models.CharField(max_length=200, blank=True, default="")
    retired_at = models.DateTimeField(null=True, blank=True, editable=False,
                                      help_text="When an operator retired this version; it prices nothing since")
    retired_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+", editable=False,
    )

    class Meta:
        ordering = ["model", "-effective_from"]
        constraints = [models.UniqueConstraint(fields=["model", "effective_from"], name="uniq_price_version")]

    def __str__(self) -> str:
        return f"{self.model} from {self.effective_from:%Y-%m-%d %H:%M:%S %Z} (#{self.pk})"

    def clean(self) -> None:
        """Each price within bounds (billing.money.price_check), normalised to a Decimal. (A missing one is the
        field's own error, not repeated here.)"""
        errors = {}
        for name in PRICE_FIELDS:
            if getattr(self, name) is None:
                continue
            try:
                setattr(self, name, price_check(getattr(self, name)))
            except ValueError as exc:
                errors[name] = str(exc)
        if self.batch_discount_percent is not None:
            try:
                self.batch_discount_percent = batch_discount_check(self.batch_discount_percent)
            except ValueError as exc:
                errors["batch_discount_percent"] = str(exc)
        if errors:
            raise ValidationError(errors)

    def save(self, *args, **kwargs):
        if self.pk is not None and not self._state.adding:
            raise ValueError("a price version is never edited; add a new version instead (price_set)")
        self.clean()  # whichever way it is added (price_create calls it first, for the message)
        super().save(*args, **kwargs)

    @property
    def terms(self) -> PriceTerms:
        return PriceTerms(
            price_id=self.pk,
            input_picos=per_million_to_picos(self.input_per_million),
            cached_input_picos=per_million_to_picos(self.cached_input_per_million),
            output_picos=per_million_to_picos(self.output_per_million),
        )

    @property
    def batch_price_terms(self) -> PriceTerms:
        """The version's batch price (billing.money.batch_terms)."""
        return batch_terms(self.terms, self.batch_discount_percent)

    def batch_price_per_million(self, column: str) -> Decimal:
        """One of PRICE_FIELDS at the batch price, USD per 1M tokens."""
        return batch_per_million(getattr(self, column), self.batch_discount_percent)
