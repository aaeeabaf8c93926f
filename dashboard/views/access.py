"""Who may see a tenant's pages: its members only; anyone else gets 404 (never says the tenant exists)."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.http import Http404

from tenants.models import Membership
from tenants.selectors import membership_get


def membership_or_404(request, slug: str) -> Membership:
    membership = membership_get(user=request.user, slug=slug)
    if membership is None:
        raise Http404("No such tenant")
    return membership


def require(allowed: bool) -> None:
    """A member without the right (a viewer creating a key): 403."""
    if not allowed:
        raise PermissionDenied("Your role in this tenant does not allow this.")
