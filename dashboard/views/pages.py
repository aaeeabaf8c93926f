"""The tenant's read pages: the tenant list, overview, invoices (usage: dashboard.views.usage)."""

from __future__ import annotations

from decimal import Decimal

from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect, render

from billing.selectors import invoices_of, usd_str
from dashboard.overview_visuals import allowance_bars, overview_chart_spec
from dashboard.selectors.overview import overview_get
from dashboard.views.access import membership_or_404
from tenants.selectors import memberships_of

@login_required
def home(request):
    memberships = list(memberships_of(user=request.user))
    if len(memberships) == 1:
        return redirect("dashboard:overview", slug=memberships[0].tenant.slug)
    return render(request, "dashboard/home.html", {"memberships": memberships})


def _plain(amount: Decimal) -> str:
    """USD as a plain decimal string, as `usd_str` writes the island's other amounts ("0", never "0E-9")."""
    return format(amount.normalize(), "f")


@login_required
def overview(request, slug: str):
    membership = membership_or_404(request, slug)
    figures = overview_get(tenant=membership.tenant)
    data = {
        "period": figures.period.label, "timezone": membership.tenant.timezone, **figures.totals,
        "spend_usd": usd_str(figures.totals["cost_femtos"]), "quota_used_tokens": figures.quota_used,
        "quota_limit_tokens": figures.quota_limit, "budget_used_usd": _plain(figures.budget_used_usd),
        "budget_limit_usd": _plain(figures.budget_limit_usd), "cache_hit_rate": figures.cache_hit_rate,
        "limits": {row.name: row.effective for row in figures.limits},
    }
    return render(request, "dashboard/overview.html", {
        "membership": membership, "tenant": membership.tenant, "page": "overview", "overview": figures,
        "overview_data": data, "overview_chart": overview_chart_spec(figures),
        "allowance_bars": allowance_bars(overview=figures, tenant=membership.tenant),
    })


@login_required
def invoices(request, slug: str):
    membership = membership_or_404(request, slug)
    return render(request, "dashboard/invoices.html", {
        "membership": membership, "tenant": membership.tenant, "page": "invoices",
        "invoices": list(invoices_of(tenant=membership.tenant)[:120]),
    })


@login_required
def invoice_detail(request, slug: str, invoice_id: str):
    membership = membership_or_404(request, slug)
    invoice = invoices_of(tenant=membership.tenant).filter(public_id=invoice_id).first()
    if invoice is None:
        raise Http404("No such invoice")
    return render(request, "dashboard/invoice_detail.html", {
        "membership": membership, "tenant": membership.tenant, "page": "invoices", "invoice": invoice,
        "lines": list(invoice.lines.all()), "credit_notes": list(invoice.credit_notes.all()),
    })
