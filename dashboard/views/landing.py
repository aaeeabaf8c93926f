"""The site's front door: `/` (what this server is, where to go next, the quick start with this server's
address), and `/favicon.ico`."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.cache import cache_control
from django.views.decorators.http import require_safe

from inference.models import ServedModel
from tenants.models import Tier
from tenants.selectors import memberships_of

FAVICON = Path(__file__).resolve().parents[1] / "static" / "dashboard" / "favicon.svg"
DEFAULT_MODEL = "smollm2-135m-instruct"


@require_safe
def landing(request):
    """Anonymous visitors: the landing page. Signed-in users: their dashboard (staff who belong to no tenant:
    the admin, where the operator console is)."""
    user = request.user
    if user.is_authenticated:
        if user.is_staff and not memberships_of(user=user).exists():
            return redirect("admin:index")
        return redirect("dashboard:home")
    models = _models_every_tier_may_use()
    return render(request, "landing.html", {
        "base_url": request.build_absolute_uri("/v1"), "models": models,
        "model": models[0] if models else DEFAULT_MODEL,
    })


def _models_every_tier_may_use() -> list[str]:
    """The enabled models every tier may call: a model only some tiers may use (one tenant's own, say) is not
    named to anonymous visitors."""
    tiers = list(Tier.objects.all())
    names = ServedModel.objects.filter(enabled=True).order_by("name").values_list("name", flat=True)
    return [name for name in names if all(tier.allows_model(name) for tier in tiers)]


@lru_cache(maxsize=1)
def _favicon() -> bytes:
    return FAVICON.read_bytes()


@require_safe
@cache_control(public=True, max_age=86400)
def favicon(request):
    """An SVG under the name browsers ask for on their own (no 404 in every page's console)."""
    return HttpResponse(_favicon(), content_type="image/svg+xml")
