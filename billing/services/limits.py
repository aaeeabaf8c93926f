"""Which limits apply to a request: the tier's defaults, the tenant's overrides, the key's own ceilings.

A tenant's limit is its override when set, else its tier's; 0 means no limit.
A key's limits (empty unless set) apply on top of its tenant's, so a key per
application can have a lower ceiling than the tenant; the stricter wins.
The tenant's monthly budget is `Tenant.monthly_spend_limit_micros`; a key may
have its own (`ApiKey.monthly_spend_limit_micros`).
"""

from __future__ import annotations

from dataclasses import dataclass

LIMIT_FIELDS = ("requests_per_minute", "tokens_per_minute", "max_concurrent_requests", "monthly_token_quota",
                "monthly_spend_limit_micros")
TIER_FIELDS = LIMIT_FIELDS[:4]  # the tier has no budget: a budget is the tenant's


@dataclass(frozen=True, slots=True)
class ScopeLimits:
    """One scope's limits (a tenant or a key); 0 = none."""

    scope: str  # "t<tenant id>" or "k<key id>"
    requests_per_minute: int = 0
    tokens_per_minute: int = 0
    max_concurrent_requests: int = 0
    monthly_token_quota: int = 0
    monthly_spend_limit_micros: int = 0

    @property
    def any(self) -> bool:
        return any(getattr(self, name) for name in LIMIT_FIELDS)


@dataclass(frozen=True, slots=True)
class LimitSource:
    """One limit of a tenant or key as the admin shows it: the values and which one applies."""

    name: str
    tier: int | None
    override: int | None
    effective: int
    source: str  # "tier", "tenant", "key" or "none"


def tenant_limits(*, tenant, tier) -> ScopeLimits:
    values = {}
    for name in TIER_FIELDS:
        override = getattr(tenant, name, None)
        values[name] = int(override if override is not None else getattr(tier, name) or 0)
    return ScopeLimits(scope=f"t{tenant.pk}", monthly_spend_limit_micros=int(tenant.monthly_spend_limit_micros or 0),
                       **values)


def key_limits(*, api_key) -> ScopeLimits | None:
    """The key's own ceilings, or None when it has none (only its tenant's apply)."""
    if api_key is None or getattr(api_key, "pk", None) is None:
        return None
    values = {name: int(getattr(api_key, name, None) or 0) for name in LIMIT_FIELDS}
    limits = ScopeLimits(scope=f"k{api_key.pk}", **values)
    return limits if limits.any else None


def limits_explain(*, tenant, api_key=None) -> list[LimitSource]:
    """Every limit of `tenant` (and `api_key`): tier value, override, the effective one and where it comes from."""
    tier = tenant.tier
    rows = []
    for name in LIMIT_FIELDS:
        tier_value = getattr(tier, name, None) if name in TIER_FIELDS else None
        override = getattr(tenant, name, None) if name in TIER_FIELDS else (tenant.monthly_spend_limit_micros or None)
        tenant_value = int(override if override is not None else tier_value or 0)
        source = "tenant" if override is not None else ("tier" if tier_value else "none")
        key_value = getattr(api_key, name, None) if api_key is not None else None
        effective = tenant_value
        if key_value is not None and key_value > 0 and (tenant_value == 0 or key_value < tenant_value):
            effective, source = int(key_value), "key"
        rows.append(LimitSource(name=name, tier=tier_value, override=key_value if api_key is not None else override,
                                effective=effective, source=source if effective else "none"))
    return rows
