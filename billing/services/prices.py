"""Price versions: added, never edited (a new `effective_from` supersedes the last), retired when set by mistake.

Every way of setting a price (`manage.py price_set`, the admin, any future API)
goes through `price_create`, which checks each amount with the model's
`clean()` (billing.money.price_check: finite, 0 to MAX_PRICE_PER_MILLION, at
most 6 decimal places) before anything is written.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from decimal import Decimal

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from billing.models import Price
from billing.money import DEFAULT_BATCH_DISCOUNT_PERCENT
from billing.models.prices import PRICE_FIELDS
from billing.services.price_cache import price_cache_clear, ttl_s

# The demo model's list price, USD per 1M tokens (cached input at half the input price).
DEFAULT_PRICES: dict[str, tuple[str, str, str]] = {
    "smollm2-135m-instruct": ("0.050000", "0.025000", "0.100000"),
}
# Before any request could have been served: the first price covers everything.
EPOCH = datetime(2000, 1, 1, tzinfo=dt_timezone.utc)


def price_lead_time() -> timedelta:
    """How far ahead of now a new version must start so every process's price cache sees it first."""
    return timedelta(seconds=ttl_s())


def price_start_check(*, model: str, effective_from: datetime | None, now: datetime | None = None,
                      lock: bool = False) -> datetime:
    """The start of a new version of `model` (default: the earliest allowed), or ValidationError."""
    now = now or timezone.now()
    earliest = now + price_lead_time()
    if effective_from is None:
        effective_from = earliest
    if timezone.is_naive(effective_from):
        raise ValidationError({"effective_from": "a time with its UTC offset (ISO-8601, e.g. 2026-12-01T00:00:00Z)"})
    existing = Price.objects.filter(model=model)
    if lock:  # serialise versions of one model: this check and the insert see the same history
        existing = existing.select_for_update()
    if existing.exists() and effective_from < earliest:
        raise ValidationError(
            {"effective_from": f"a new version of a priced model starts at {earliest.isoformat()} or later"}
        )
    if existing.filter(effective_from=effective_from).exists():
        raise ValidationError({"effective_from": "this model already has a version starting then"})
    return effective_from


@transaction.atomic
def price_create(
    *,
    model: str,
    input_per_million: Decimal | str,
    cached_input_per_million: Decimal | str,
    output_per_million: Decimal | str,
    batch_discount_percent: int | str = DEFAULT_BATCH_DISCOUNT_PERCENT,
    effective_from: datetime | None = None,
    created_by=None,
    note: str = "",
    now: datetime | None = None,
) -> Price:
    """Add a price version. Default start: as soon as every process can see it (now + the cache TTL).

    `batch_discount_percent` (a whole percent, 0 to 100, default 50): what Batch API lines pay less, on every
    kind of token (billing.money.batch_terms).

    A model's first price may start at any time (nothing was priced before it);
    a later one no sooner than `price_lead_time()` from now, so that no request
    is costed with a version another process has not seen yet.
    """
    now = now or timezone.now()
    model = (model or "").strip()
    if not model:
        raise ValidationError({"model": "the served model's name is required"})
    price = Price(model=model, input_per_million=input_per_million, cached_input_per_million=cached_input_per_million,
                  output_per_million=output_per_million, created_by=created_by, note=note,
                  batch_discount_percent=batch_discount_percent)
    missing = {name: "a price is required" for name in PRICE_FIELDS if getattr(price, name) in (None, "")}
    if batch_discount_percent in (None, ""):
        missing["batch_discount_percent"] = "a whole percent from 0 to 100 is required"
    if missing:
        raise ValidationError(missing)
    price.clean()  # the amounts (billing.money.price_check)
    price.effective_from = price_start_check(model=model, effective_from=effective_from, now=now, lock=True)
    price.save()
    return price


@transaction.atomic
def price_retire(*, price: Price, retired_by=None, now: datetime | None = None) -> bool:
    """Retire a price version (False: it already was). Nothing is deleted or rewritten: the row and the
    records it priced stay; from the next price load on (within the price cache's TTL in every process)
    it prices nothing, and the version before it, if any, applies again. A row that failed to load
    (billing.services.price_cache) is retired the same way."""
    retired = Price.objects.filter(pk=price.pk, retired_at__isnull=True).update(
        retired_at=now or timezone.now(), retired_by=retired_by)
    transaction.on_commit(price_cache_clear)
    return bool(retired)


def prices_bootstrap_defaults() -> list[Price]:
    """Give each demo model its list price if it has none yet (idempotent); the created versions."""
    created = []
    for model, (input_, cached, output) in DEFAULT_PRICES.items():
        if not Price.objects.filter(model=model).exists():
            created.append(price_create(model=model, input_per_million=input_, cached_input_per_million=cached,
                                        output_per_million=output, effective_from=EPOCH, note="bootstrap default"))
    return created
