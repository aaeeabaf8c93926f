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
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings

from billing.money import PriceTerms, multiplier_to_milli
from common.cache import TtlCache


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


def ttl_s() -> float:
    return float(settings.PRICE_CACHE_TTL_S)


_snapshots: TtlCache[str, "PricingSnapshot"] = TtlCache("price snapshot", ttl=ttl_s, max_entries=1)


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
    return _snapshots.get_or_load("snapshot", pricing_snapshot_load)


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
