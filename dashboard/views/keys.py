"""API keys (owners and members create and revoke; viewers read) and the owner's budget and alert settings."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.db import transaction
from django.http import Http404
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from billing.selectors import (limits_explain, operator_budget_micros, own_alert_percents, owner_budget_micros,
                               tenant_budget_micros)
from billing.services.budgets import budget_alert_percents_set, owner_budget_set
from common.errors import ApiError
from dashboard.forms import ApiKeyCreateForm, BudgetAlertsForm, BudgetForm
from dashboard.views.access import membership_or_404, require
from tenants.selectors import api_key_get, api_key_list, api_key_status
from tenants.services.api_keys import api_key_create, api_key_revoke
from tenants.services.limits import limits_set


def _keys_page(request, membership, form, created=None):
    tenant = membership.tenant
    now = timezone.now()
    keys = [(key, api_key_status(api_key=key, now=now)) for key in api_key_list(tenant=tenant)]
    return render(request, "dashboard/keys.html", {
        "membership": membership, "tenant": tenant, "page": "keys", "keys": keys, "form": form, "created": created,
    })


@login_required
def keys(request, slug: str):
    membership = membership_or_404(request, slug)
    if request.method != "POST":
        return _keys_page(request, membership, ApiKeyCreateForm())
    require(membership.can_manage_keys)
    form = ApiKeyCreateForm(request.POST)
    if not form.is_valid():
        return _keys_page(request, membership, form)
    data = form.cleaned_data
    expires = timezone.now() + timedelta(days=data["expires_days"]) if data.get("expires_days") else None
    try:
        with transaction.atomic():
            created = api_key_create(tenant=membership.tenant, name=data["name"], scopes=data["scopes"],
                                     expires_at=expires, created_by=request.user)
            if form.limit_values():
                limits_set(tenant=membership.tenant, api_key=created.api_key, values=form.limit_values())
    except ApiError as exc:
        form.add_error(exc.param if exc.param in form.fields else None, exc.message)
        return _keys_page(request, membership, form)
    except ValidationError as exc:  # a limit the key's row cannot hold (the model's own validation)
        for field, errors in exc.message_dict.items():
            for error in errors:
                form.add_error(field if field in form.fields else None, error)
        return _keys_page(request, membership, form)
    # The secret is in this response only: no redirect, nothing stored that could show it again.
    response = _keys_page(request, membership, ApiKeyCreateForm(), created=created)
    response["Cache-Control"] = "no-store"
    return response


@login_required
@require_POST
def key_revoke(request, slug: str, key_id: str):
    membership = membership_or_404(request, slug)
    require(membership.can_manage_keys)  # before the lookup: a viewer learns nothing of which keys exist
    api_key = api_key_get(tenant=membership.tenant, key_id=key_id)
    if api_key is None:
        raise Http404("No such key")
    api_key_revoke(api_key=api_key)
    messages.success(request, f"Key {api_key.name} ({api_key.redacted}) revoked.")
    return redirect("dashboard:keys", slug=slug)


@login_required
def tenant_settings(request, slug: str):
    """The tenant's limits (everyone reads them); its owners' own monthly budget (owners change it). The
    operator's cap is shown, never changed here: the lower of the two applies."""
    membership = membership_or_404(request, slug)
    tenant = membership.tenant
    form = BudgetForm(initial={"monthly_budget_usd": _usd(owner_budget_micros(tenant=tenant))})
    if request.method == "POST":
        require(membership.can_manage_settings)
        form = BudgetForm(request.POST)
        if form.is_valid():
            budget = form.cleaned_data.get("monthly_budget_usd") or 0
            owner_budget_set(tenant=tenant, micros=int(budget * 1_000_000))
            messages.success(request, "Budget saved.")
            return redirect("dashboard:settings", slug=slug)
    return _settings_page(request, membership, form, _alerts_form(tenant))


def _usd(micros: int) -> Decimal | None:
    """Micro-dollars in USD, exact and without trailing zeros: 2500000 -> 2.5 (None: 0, no budget)."""
    if not micros:
        return None
    usd = Decimal(micros).scaleb(-6)
    return usd.quantize(Decimal(1)) if usd == usd.to_integral_value() else usd.normalize()


def _alerts_form(tenant) -> BudgetAlertsForm:
    return BudgetAlertsForm(initial={"alert_percents": ", ".join(map(str, own_alert_percents(tenant=tenant)))})


def _settings_page(request, membership, form, alerts_form):
    tenant = membership.tenant
    return render(request, "dashboard/settings.html", {
        "membership": membership, "tenant": tenant, "page": "settings", "form": form, "alerts_form": alerts_form,
        "own_alert_percents": own_alert_percents(tenant=tenant),
        "limits": limits_explain(tenant=tenant), "platform_alert_percents": settings.BUDGET_ALERT_PERCENTS,
        "operator_budget_usd": _usd(operator_budget_micros(tenant=tenant)),
        "owner_budget_usd": _usd(owner_budget_micros(tenant=tenant)),
        "budget_usd": _usd(tenant_budget_micros(tenant=tenant)),
    })


@login_required
@require_POST
def budget_alerts(request, slug: str):
    """The tenant's budget alert thresholds (owners only); empty: the platform's."""
    membership = membership_or_404(request, slug)
    require(membership.can_manage_settings)
    form = BudgetAlertsForm(request.POST)
    if not form.is_valid():
        budget = BudgetForm(initial={"monthly_budget_usd": _usd(owner_budget_micros(tenant=membership.tenant))})
        return _settings_page(request, membership, budget, form)
    budget_alert_percents_set(tenant=membership.tenant, percents=form.cleaned_data["alert_percents"])
    messages.success(request, "Budget alerts saved.")
    return redirect("dashboard:settings", slug=slug)
