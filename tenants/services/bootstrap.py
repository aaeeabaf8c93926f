"""The tenants' part of `manage.py bootstrap` (inference.bootstrap.platform_bootstrap):
default tiers, a demo tenant, an admin user.

Idempotent: rows that exist are left exactly as they are (an operator may have
edited a tier's limits in the admin since), so a second run changes nothing but
adds the new demo key it prints.

Tier limits follow the shape of the public OpenAI / Anthropic usage tiers
(requests and tokens per minute, concurrency, a monthly allowance), scaled to
what one CPU or GPU worker running a small model can serve.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from decimal import Decimal

from django.contrib.auth import get_user_model

from tenants.models import Membership, Tenant, Tier
from tenants.services.api_keys import NewApiKey, api_key_create
from tenants.services.tenants import membership_ensure

# The free tier's allowed_models come from the caller (inference serves the models).
DEFAULT_TIERS: dict[str, dict] = {
    "free": {
        "display_name": "Free",
        "priority": 2,
        "queue_weight": 1,
        "requests_per_minute": 20,
        "tokens_per_minute": 40_000,
        "max_concurrent_requests": 4,
        "max_output_tokens": 512,
        "max_context": 4096,
        "monthly_token_quota": 2_000_000,
        "batch_queue_tokens": 2_000_000,
        "price_multiplier": Decimal("1.000"),
    },
    "pro": {
        "display_name": "Pro",
        "priority": 1,
        "queue_weight": 4,
        "requests_per_minute": 600,
        "tokens_per_minute": 400_000,
        "max_concurrent_requests": 32,
        "max_output_tokens": 4096,
        "max_context": 8192,
        "monthly_token_quota": 200_000_000,
        "batch_queue_tokens": 200_000_000,
        "allowed_models": ["*"],
        "price_multiplier": Decimal("1.000"),
    },
    "enterprise": {
        "display_name": "Enterprise",
        "priority": 0,
        "queue_weight": 16,
        "requests_per_minute": 10_000,
        "tokens_per_minute": 4_000_000,
        "max_concurrent_requests": 256,
        "max_output_tokens": 8192,
        "max_context": 8192,
        "monthly_token_quota": 0,  # unlimited; bounded by the tenant's spend limit
        "batch_queue_tokens": 0,  # unlimited
        "allowed_models": ["*"],
        "price_multiplier": Decimal("0.900"),
    },
}

DEMO_TENANT_SLUG = "demo"
DEMO_TENANT_TIER = "pro"
DEMO_OWNER_USERNAME = "demo-owner"  # the demo tenant's owner on the dashboard (not staff)


@dataclass
class BootstrapResult:
    created: list[str]  # human-readable names of what this run created
    demo_tenant: Tenant
    demo_key: NewApiKey
    admin_username: str
    admin_password: str | None  # only when this run created the admin user
    owner_username: str = DEMO_OWNER_USERNAME
    owner_password: str | None = None  # only when this run created the demo owner


def tiers_ensure(*, free_models: list[str]) -> tuple[dict[str, Tier], list[str]]:
    """The default tiers, created where missing; the free tier may use `free_models`."""
    tiers, created = {}, []
    for name, defaults in DEFAULT_TIERS.items():
        if name == "free":
            defaults = {**defaults, "allowed_models": list(free_models)}
        tier, was_created = Tier.objects.get_or_create(name=name, defaults=defaults)
        tiers[name] = tier
        if was_created:
            created.append(f"tier {name}")
    return tiers, created


def demo_tenant_ensure(*, tiers: dict[str, Tier], admin_username: str, admin_password: str | None,
                       admin_email: str) -> BootstrapResult:
    """Tenant `demo`, an admin user owning it (created where missing) and a new demo API key."""
    created = []
    tenant, tenant_created = Tenant.objects.get_or_create(
        slug=DEMO_TENANT_SLUG, defaults={"name": "Demo tenant", "tier": tiers[DEMO_TENANT_TIER]}
    )
    if tenant_created:
        created.append(f"tenant {tenant.slug}")

    User = get_user_model()
    admin = User.objects.filter(username=admin_username).first()
    password_shown = None
    if admin is None:
        password_shown = admin_password or secrets.token_urlsafe(12)
        admin = User.objects.create_superuser(username=admin_username, email=admin_email, password=password_shown)
        created.append(f"admin user {admin_username}")
    membership_ensure(user=admin, tenant=tenant, role=Membership.Role.OWNER)
    owner_password = None
    if not User.objects.filter(username=DEMO_OWNER_USERNAME).exists():
        owner_password = secrets.token_urlsafe(12)
        owner = User.objects.create_user(username=DEMO_OWNER_USERNAME, password=owner_password)
        membership_ensure(user=owner, tenant=tenant, role=Membership.Role.OWNER)
        created.append(f"dashboard user {DEMO_OWNER_USERNAME}")

    key = api_key_create(tenant=tenant, name="demo (bootstrap)", created_by=admin)
    return BootstrapResult(created=created, demo_tenant=tenant, demo_key=key, admin_username=admin_username,
                           admin_password=password_shown, owner_password=owner_password)
