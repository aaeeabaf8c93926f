"""A per-process snapshot of every price version and tier multiplier, for the worker's record insert.

Costing a step's records must not add a query to the worker's one INSERT
(`usage_records_insert`), so the price table (a few rows per model) and the
tiers' multipliers are read at most once per ``settings.PRICE_CACHE_TTL_S``
seconds (default 10) and whenever a Price or Tier is saved in this process.

Exactness across processes: a new price version may only take effect at
least one TTL after it is written (`price_create` refuses an earlier
`effective_from`, except for a model's first price). Every snapshot taken
before the write expires before the version applies, so a request admitted
under it is always costed with it. A tier's multiplier is the one in force
when the record is written; another process sees a change within the TTL.
"""

from __future__ import annotations

import bisect
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings

from billing.money import PriceTerms, multiplier_to_milli

DEFAULT_TTL_S = 10.0


@dataclass(frozen=True, slots=True)
class PricingSnapshot:
    # model -> (effective_from ascending, the terms of each)
    prices: dict[str, tuple[list[datetime], list[PriceTerms]]] = field(default_factory=dict)
    multipliers: dict[str, int] = field(default_factory=dict)  # tier name -> thousandths

    def terms_at(self, model: str, at: datetime) -> PriceTerms | None:
        """The version of `model` in force at `at` (the latest effective_from <= at), or None."""
        versions = self.prices.get(model)
        if not versions:
            return None
        index = bisect.bisect_right(versions[0], at) - 1
        return versions[1][index] if index >= 0 else None

    def multiplier_milli(self, tier: str) -> int:
        return self.multipliers.get(tier, 1000)  # a deleted tier: list price


_lock = threading.Lock()
_cached: tuple[float, PricingSnapshot] | None = None
_generation = 0  # bumped by every clear: a load that began before one is not kept


def ttl_s() -> float:
    return float(getattr(settings, "PRICE_CACHE_TTL_S", DEFAULT_TTL_S))


def pricing_snapshot_load() -> PricingSnapshot:
    from billing.models import Price
    from tenants.models import Tier

    prices: dict[str, tuple[list[datetime], list[PriceTerms]]] = {}
    for price in Price.objects.order_by("model", "effective_from"):
        times, terms = prices.setdefault(price.model, ([], []))
        times.append(price.effective_from)
        terms.append(price.terms)
    multipliers = {name: multiplier_to_milli(m) for name, m in Tier.objects.values_list("name", "price_multiplier")}
    return PricingSnapshot(prices=prices, multipliers=multipliers)


def pricing_snapshot() -> PricingSnapshot:
    """The cached snapshot, reloaded once it is older than the TTL."""
    global _cached
    cached = _cached
    if cached is not None and time.monotonic() < cached[0]:
        return cached[1]
    generation = _generation
    snapshot = pricing_snapshot_load()
    with _lock:
        if generation == _generation:
            _cached = (time.monotonic() + ttl_s(), snapshot)
    return snapshot


def price_cache_clear(**_: object) -> None:
    global _cached, _generation
    with _lock:
        _cached = None
        _generation += 1


def connect_signals() -> None:
    from django.db.models.signals import post_delete, post_save

    from billing.models import Price
    from tenants.models import Tier

    for model in (Price, Tier):
        for signal in (post_save, post_delete):
            signal.connect(price_cache_clear, sender=model, dispatch_uid=f"price_cache_clear:{model.__name__}")
