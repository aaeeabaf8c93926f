"""Reads for tenants, tiers and API keys. Every key read is scoped to one tenant."""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.db.models import QuerySet, prefetch_related_objects

from tenants.models import PUBLIC_ID_PREFIX, ApiKey, Membership, Tenant, Tier, TierModelLimit


def tier_get(*, name: str) -> Tier | None:
    return Tier.objects.filter(name=name).first()


# A tier's per-model limit rows (TierModelLimit, related name): the verified-key rows bring them with their tier
# (tenants.services.api_keys, one query more per row read, none per request), cached and kept warm with the row.
TIER_MODEL_LIMITS = "model_limits"
KEY_ROW_MODEL_LIMITS = f"tenant__tier__{TIER_MODEL_LIMITS}"  # the same, from an ApiKey row


def tier_model_limits_load(tier: Tier) -> None:
    """Read the tier's per-model limit rows onto it (one query), unless they came with it already."""
    if TIER_MODEL_LIMITS not in getattr(tier, "_prefetched_objects_cache", {}):
        prefetch_related_objects([tier], TIER_MODEL_LIMITS)


async def atier_model_limit(*, tier: Tier, model: str) -> TierModelLimit | None:
    """The tier's limit row for `model`, or None. No query for a tier that came with a verified-key row (the
    hot path); any other tier's rows are read once, off the event loop."""
    if TIER_MODEL_LIMITS not in getattr(tier, "_prefetched_objects_cache", {}):
        await sync_to_async(tier_model_limits_load)(tier)
    for row in tier.model_limits.all():  # the loaded rows: a handful per tier
        if row.model_name == model:
            return row
    return None


def tenant_get(*, slug: str) -> Tenant | None:
    return Tenant.objects.select_related("tier").filter(slug=slug).first()


def api_key_list(*, tenant: Tenant) -> QuerySet[ApiKey]:
    return ApiKey.objects.filter(tenant=tenant).select_related("created_by").order_by("-created_at", "-pk")


def api_key_get(*, tenant: Tenant, key_id: str) -> ApiKey | None:
    """The tenant's key with this public id (`key_...`), or None (also for other tenants' ids and anything else)."""
    text = str(key_id)
    if not text.startswith(PUBLIC_ID_PREFIX) or len(text) > ApiKey._meta.get_field("public_id").max_length:
        return None
    return api_key_list(tenant=tenant).filter(public_id=text).first()


def api_key_pks_of(*, tenant: Tenant, public_ids: list[str]) -> dict[str, int]:
    """public id -> pk for the tenant's keys among `public_ids` (others' and unknown ids are left out)."""
    return dict(ApiKey.objects.filter(tenant=tenant, public_id__in=public_ids).values_list("public_id", "pk"))


def api_key_public_ids(*, pks) -> dict[int, str]:
    """pk -> public id of these keys."""
    return dict(ApiKey.objects.filter(pk__in=list(pks)).values_list("pk", "public_id"))


def api_key_find(*, reference: str) -> ApiKey | None:
    """Operator lookup (commands): a public id `key_...`, a row id, a stored prefix `sk-xxxxxxxxxx`, or a full key."""
    reference = reference.strip()
    if reference.startswith(PUBLIC_ID_PREFIX):
        return ApiKey.objects.filter(public_id=reference).first()
    if reference.isascii() and reference.isdigit():
        return ApiKey.objects.filter(pk=int(reference)).first() if len(reference) < 19 else None
    parts = reference.split("-")
    if len(parts) >= 2 and parts[0] == "sk":
        return ApiKey.objects.filter(prefix=f"sk-{parts[1]}").first()
    return None


def api_key_status(*, api_key: ApiKey, now=None) -> str:
    if api_key.revoked_at is not None:
        return "revoked"
    if not api_key.is_usable(now):
        return "expired"
    return "active"


def memberships_of(*, user) -> QuerySet[Membership]:
    """The tenants a dashboard user belongs to, with their role."""
    if not getattr(user, "is_authenticated", False):
        return Membership.objects.none()
    return Membership.objects.filter(user=user).select_related("tenant", "tenant__tier").order_by("tenant__name")


def membership_get(*, user, slug: str) -> Membership | None:
    """The user's membership of the tenant `slug`, or None (not a member, or no such tenant: callers answer 404)."""
    return memberships_of(user=user).filter(tenant__slug=slug).first()
