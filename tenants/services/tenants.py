"""Tenant lifecycle: create, change tier, suspend, reactivate, memberships."""

from __future__ import annotations

from django.db import transaction
from django.utils.text import slugify

from common.errors import InvalidRequest
from tenants.models import Membership, Tenant, Tier


def tenant_create(*, slug: str, name: str, tier: Tier) -> Tenant:
    """A new tenant on `tier`, with no budget (billing's: billing.services.budgets.operator_budget_set)."""
    if slugify(slug) != slug or not slug:
        raise InvalidRequest(f"Invalid slug {slug!r}: use lowercase letters, digits and hyphens.", param="slug")
    if not name.isprintable():
        raise InvalidRequest("The tenant name may not contain control characters.", param="name")
    if Tenant.objects.filter(slug=slug).exists():
        raise InvalidRequest(f"A tenant with slug {slug!r} already exists.", param="slug")
    return Tenant.objects.create(slug=slug, name=name.strip() or slug, tier=tier)


def tenant_change_tier(*, tenant: Tenant, tier: Tier) -> Tenant:
    """Takes effect on the tenant's next request (auth reads the tier every time)."""
    if tenant.tier_id != tier.pk:
        tenant.tier = tier
        tenant.save(update_fields=["tier"])
    return tenant


def tenant_suspend(*, tenant: Tenant) -> Tenant:
    """Its keys get 403 from the next request on."""
    if tenant.status != Tenant.Status.SUSPENDED:
        tenant.status = Tenant.Status.SUSPENDED
        tenant.save(update_fields=["status"])
    return tenant


def tenant_reactivate(*, tenant: Tenant) -> Tenant:
    if tenant.status != Tenant.Status.ACTIVE:
        tenant.status = Tenant.Status.ACTIVE
        tenant.save(update_fields=["status"])
    return tenant


@transaction.atomic
def user_create_member(*, tenant: Tenant, username: str, role: str, email: str = "", password: str | None = None):
    """A new dashboard user, member of `tenant` with `role`; without a password it cannot log in until one is set."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.password_validation import validate_password
    from django.core.exceptions import ValidationError

    if role not in Membership.Role.values:
        raise InvalidRequest(f"Unknown role {role!r}; one of {', '.join(Membership.Role.values)}.", param="role")
    User = get_user_model()
    username = (username or "").strip()
    if not username:
        raise InvalidRequest("A user needs a username.", param="username")
    if User.objects.filter(username=username).exists():
        raise InvalidRequest(f"A user named {username!r} already exists.", param="username")
    user = User(username=username, email=email or "")
    if password:
        try:
            validate_password(password, user)
        except ValidationError as exc:
            raise InvalidRequest(" ".join(exc.messages), param="password") from exc
        user.set_password(password)
    else:
        user.set_unusable_password()
    user.save()
    Membership.objects.create(user=user, tenant=tenant, role=role)
    return user


@transaction.atomic
def membership_ensure(*, user, tenant: Tenant, role: str = Membership.Role.MEMBER) -> Membership:
    """Idempotent: an existing membership keeps its role."""
    membership, _created = Membership.objects.get_or_create(user=user, tenant=tenant, defaults={"role": role})
    return membership
