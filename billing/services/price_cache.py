"""A per-process snapshot of every price version and tier multiplier, for the worker's record insert.

Costing a step's records must not add a query to the worker's one INSERT
(`usage_records_insert`), so the price table (a few rows per model) and the
tiers' multipliers are read at most once per ``settings.PRICE_CACHE_TTL_S``
seconds and whenever a Price or Tier is saved in this process (on the
project's one per-process cache, `common.cache.TtlCache`: a load that raced a
save is not kept).

Exactness across processes: a new price version may only take effect at
least one TTL after it is written (`price_create` refuses an earlier
`effective_from`, except for a model's first price). Every snapshot taken
before the write expires before the version applies, so a request admitted
under it is always costed with it. A tier's multiplier is the one in force
when the record is written; another process sees a change within the TTL.

A row that does not pass `billing.money.price_check` (written by hand in SQL:
out of bounds, NaN, more places than a price has) is skipped, never raised:
the other models keep their prices. Its model is not served while that row is
the version in force (`terms_at` raises PriceUnavailable: 503
`model_unavailable`), so nothing is served unbilled; each load logs it at
ERROR (once per process and row), and the admin's price list marks it
(`invalid_prices`). Retired versions (`retired_at`) are left out: the version
before a retired one applies again.
"""

from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass, field
from datetime import datetime
from datetime import timezone as dt_timezone

from asgiref.sync import sync_to_async
from django.conf import settings

from billing.money import (
    DEFAULT_BATCH_DISCOUNT_PERCENT,
    PriceTerms,
    batch_discount_check,
    batch_terms,
    multiplier_to_milli,
    per_million_to_picos,
    price_check,
)
from common.cache import TtlCache
from common.errors import ServiceUnavailable

logger = logging.getLogger(__name__)


class PriceUnavailable(ServiceUnavailable):
    """The version of a model's price in force cannot be read: the model is not served (nor billed)."""

    code = "model_unavailable"

    def __init__(self, model: str) -> None:
        super().__init__(f"The model `{model}` has no valid price right now, so it is not served. "
                         "The operators have been alerted; please retry later.", param="model")
        self.model = model


@dataclass(frozen=True, slots=True)
class InvalidPrice:
    """A price row the loader skipped: its id, model, start and why."""

    price_id: int
    model: str
    effective_from: datetime
    reason: str


@dataclass(frozen=True, slots=True)
class PricingSnapshot:
    # model -> (effective_from ascending, the terms of each: None for a row that failed to load)
    prices: dict[str, tuple[list[datetime], list[PriceTerms | None]]] = field(default_factory=dict)
    multipliers: dict[str, int] = field(default_factory=dict)  # tier name -> thousandths
    invalid: tuple[InvalidPrice, ...] = ()
    batch_discounts: dict[int, int] = field(default_factory=dict)  # price id -> its batch discount, percent

    def batch_terms_of(self, terms: PriceTerms) -> PriceTerms:
        """A version's batch price (billing.money.batch_terms, at the version's own discount)."""
        return batch_terms(terms, self.batch_discounts.get(terms.price_id, DEFAULT_BATCH_DISCOUNT_PERCENT))

    def terms_at(self, model: str, at: datetime) -> PriceTerms | None:
        """The version of `model` in force at `at` (the latest effective_from <= at), or None (unpriced);
        PriceUnavailable when that version is a row that failed to load."""
        versions = self.prices.get(model)
        if not versions:
            return None
        index = bisect.bisect_right(versions[0], at) - 1
        if index < 0:
            return None
        terms = versions[1][index]
        if terms is None:
            raise PriceUnavailable(model)
        return terms

    def multiplier_milli(self, tier: str) -> int:
        return self.multipliers.get(tier, 1000)  # a deleted tier: list price


def ttl_s() -> float:
    return float(settings.PRICE_CACHE_TTL_S)


_snapshots: TtlCache[str, "PricingSnapshot"] = TtlCache("price snapshot", ttl=ttl_s, max_entries=1)


_reported: set[tuple[int, str]] = set()  # (price id, reason) logged by this process


def price_rows() -> list[tuple[int, str, datetime, PriceTerms | None, str, int]]:
    """Every unretired price row as (id, model, effective_from, terms or None, why not, batch discount
    percent), by model and start.

    The amounts are read as text, so a row whose value the ORM could not even convert (a hand-written
    99999999999999 in SQLite's REAL column) is reported, not raised."""
    from django.db.models import CharField
    from django.db.models.functions import Cast

    from billing.models import Price
    from billing.models.prices import PRICE_FIELDS

    rows = (Price.objects.filter(retired_at__isnull=True).order_by("model", "effective_from")
            .annotate(**{f"{name}_text": Cast(name, CharField()) for name in PRICE_FIELDS})
            .values_list("pk", "model", "effective_from", "batch_discount_percent",
                         *(f"{name}_text" for name in PRICE_FIELDS)))
    out = []
    for pk, model, effective_from, discount, *texts in rows:
        try:
            picos = [per_million_to_picos(price_check(text)) for text in texts]
            discount = batch_discount_check(discount)
        except ValueError as exc:
            out.append((pk, model, effective_from, None, str(exc), DEFAULT_BATCH_DISCOUNT_PERCENT))
            continue
        out.append((pk, model, effective_from, PriceTerms(pk, *picos), "", discount))
    return out


def pricing_snapshot_load() -> PricingSnapshot:
    from tenants.models import Tier

    prices: dict[str, tuple[list[datetime], list[PriceTerms | None]]] = {}
    invalid = []
    discounts: dict[int, int] = {}
    for pk, model, effective_from, terms, reason, discount in price_rows():
        discounts[pk] = discount
        times, versions = prices.setdefault(model, ([], []))
        times.append(effective_from)
        versions.append(terms)
        if terms is None:
            invalid.append(InvalidPrice(price_id=pk, model=model, effective_from=effective_from, reason=reason))
            if (pk, reason) not in _reported:
                _reported.add((pk, reason))
                logger.error("price #%s of %s cannot be used (%s): skipped; %s is not served while it is the "
                             "version in force. Retire it in the admin (Billing > Prices) and add a valid version.",
                             pk, model, reason, model)
    multipliers = {name: multiplier_to_milli(m) for name, m in Tier.objects.values_list("name", "price_multiplier")}
    return PricingSnapshot(prices=prices, multipliers=multipliers, invalid=tuple(invalid), batch_discounts=discounts)


def pricing_snapshot() -> PricingSnapshot:
    """The cached snapshot, reloaded once it is older than the TTL."""
    return _snapshots.get_or_load("snapshot", pricing_snapshot_load)


async def aprice_in_force_check(*, model: str) -> None:
    """Before a request is admitted: PriceUnavailable (503 `model_unavailable`) when the version of `model`'s
    price in force now is a row that failed to load, so the model is not served unbilled. Costs nothing
    while the snapshot is fresh; a reload (once per PRICE_CACHE_TTL_S) runs off the event loop."""
    snapshot = pricing_snapshot_fresh() or await sync_to_async(pricing_snapshot)()
    snapshot.terms_at(model, datetime.now(dt_timezone.utc))


def pricing_snapshot_fresh() -> PricingSnapshot | None:
    """The cached snapshot if it is still fresh, else None (the web side then loads it off its event loop)."""
    return _snapshots.get("snapshot")


def price_cache_clear(**_: object) -> None:
    _snapshots.clear()


def connect_signals() -> None:
    from django.db.models.signals import post_delete, post_save

    from billing.models import Price
    from tenants.models import Tier

    for model in (Price, Tier):
        for signal in (post_save, post_delete):
            signal.connect(price_cache_clear, sender=model, dispatch_uid=f"price_cache_clear:{model.__name__}")
