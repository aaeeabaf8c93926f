"""Versioned prices: one row per served model and `effective_from`, never edited in place."""

from decimal import Decimal

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone

from billing.money import PRICE_PLACES, PriceTerms, per_million_to_picos


def _price_field(label: str) -> models.DecimalField:
    return models.DecimalField(
        max_digits=12, decimal_places=PRICE_PLACES, validators=[MinValueValidator(Decimal(0))],
        help_text=f"USD per 1M {label} tokens (up to {PRICE_PLACES} decimal places)",
    )


class Price(models.Model):
    """The price of a served model from `effective_from` until the next version of the same model.

    A correction is a new version: a saved row never changes (`save` refuses),
    so every usage record's `price` still explains its cost.
    """

    model = models.CharField(max_length=100, help_text="Served model name, as requests name it")
    input_per_million = _price_field("uncached input")
    cached_input_per_million = _price_field("cached input (prefix-cache hits)")
    output_per_million = _price_field("output")
    effective_from = models.DateTimeField()
    created_at = models.DateTimeField(default=timezone.now)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    note = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        ordering = ["model", "-effective_from"]
        constraints = [models.UniqueConstraint(fields=["model", "effective_from"], name="uniq_price_version")]

    def __str__(self) -> str:
        return f"{self.model} from {self.effective_from:%Y-%m-%d %H:%M:%S %Z} (#{self.pk})"

    def save(self, *args, **kwargs):
        if self.pk is not None and not self._state.adding:
            raise ValueError("a price version is never edited; add a new version instead (price_set)")
        super().save(*args, **kwargs)

    @property
    def terms(self) -> PriceTerms:
        return PriceTerms(
            price_id=self.pk,
            input_picos=per_million_to_picos(self.input_per_million),
            cached_input_picos=per_million_to_picos(self.cached_input_per_million),
            output_picos=per_million_to_picos(self.output_per_million),
        )
