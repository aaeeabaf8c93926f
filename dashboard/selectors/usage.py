"""A tenant's usage for the dashboard's pages: billing's reads (billing.selectors: figures per local day,
latency, totals; per model), the usage page's longest range, and the models filter kept a minute per process."""

from __future__ import annotations

from billing.selectors import (latency_by_day, models_in, tenant_models, usage_by_day, usage_by_day_and_model,
                               usage_totals)
from common.cache import TtlCache
from tenants.models import Tenant

__all__ = ["MAX_RANGE_DAYS", "latency_by_day", "models_in", "models_used", "usage_by_day", "usage_by_day_and_model",
           "usage_totals"]

MAX_RANGE_DAYS = 92  # the usage page's longest range
MODELS_USED_TTL_S = 60  # a new model shows in the filter within a minute

_models_used: TtlCache[int, list[str]] = TtlCache("models per tenant (dashboard filter)", ttl=MODELS_USED_TTL_S,
                                                  max_entries=10_000)


def models_used(*, tenant: Tenant) -> list[str]:
    """The models in the tenant's rollups and latest records, kept a minute: what the usage page's filter
    accepts besides the models of the range shown (a model picked stays picked when the range changes)."""
    return _models_used.get_or_load(tenant.pk, lambda: tenant_models(tenant=tenant))
