"""Reads of the served-model registry, as a tier sees it."""

from __future__ import annotations

from inference.models import ServedModel
from tenants.models import Tier


def served_model_list_for_tier(*, tier: Tier) -> list[ServedModel]:
    """Enabled models the tier may call, by name."""
    return [model for model in ServedModel.objects.filter(enabled=True).order_by("name") if tier.allows_model(model.name)]


def served_model_get_for_tier(*, tier: Tier, name: str) -> ServedModel | None:
    """The enabled model `name` if the tier may call it, else None (callers answer 404)."""
    if not isinstance(name, str) or not name or len(name) > 100 or not tier.allows_model(name):
        return None
    return ServedModel.objects.filter(enabled=True, name=name).first()


async def aserved_model_get_for_tier(*, tier: Tier, name: str) -> ServedModel | None:
    if not isinstance(name, str) or not name or len(name) > 100 or not tier.allows_model(name):
        return None
    return await ServedModel.objects.filter(enabled=True, name=name).afirst()
