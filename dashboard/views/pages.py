"""The tenant's read pages: the tenant list, overview, usage (with its CSV), invoices."""

from __future__ import annotations

import csv
from decimal import Decimal

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse, HttpResponseBadRequest
from django.shortcuts import redirect, render

from billing.selectors import days_between, invoices_of, today_in, usd_str
from dashboard.charts import usage_charts
from dashboard.forms import UsageFilterForm
from dashboard.overview_visuals import allowance_bars, overview_chart_spec
from dashboard.selectors.overview import overview_get
from dashboard.selectors.usage import latency_by_day, models_used, usage_by_day
from dashboard.usage_table import usage_table_rows
from dashboard.views.access import membership_or_404
from tenants.selectors import api_key_list, memberships_of

USAGE_COLUMNS = ("day", "requests", "input_tokens", "cached_input_tokens", "output_tokens", "spend_usd",
                 "ttft_p50_s", "ttft_p95_s", "errors", "error_rate")


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


def _usage(request, membership) -> tuple[UsageFilterForm, dict | None]:
    tenant = membership.tenant
    keys = list(api_key_list(tenant=tenant))
    form = UsageFilterForm(request.GET, models=models_used(tenant=tenant), keys=keys, today=today_in(tenant.timezone))
    if not form.is_valid():
        return form, None
    data = form.cleaned_data
    days = days_between(first=data["start"], last=data["end"], tz=tenant.timezone)
    models = (data["model"],) if data.get("model") else ()
    key = next((key for key in keys if key.public_id == data.get("key")), None)
    key_ids = (key.pk,) if key else ()
    sums = usage_by_day(tenant=tenant, days=days, models=models, api_key_ids=key_ids)
    latency = latency_by_day(tenant=tenant, days=days, models=models, api_key_ids=key_ids)
    rows = []
    for day in days.days:
        figures, timing = sums[day], latency[day]
        rows.append({
            "day": day.isoformat(), "requests": figures["requests"], "input_tokens": figures["input_tokens"],
            "cached_input_tokens": figures["cached_input_tokens"], "output_tokens": figures["output_tokens"],
            "spend_usd": usd_str(figures["cost_femtos"]), "ttft_p50_s": timing["ttft_p50_s"],
            "ttft_p95_s": timing["ttft_p95_s"], "errors": timing["errors"], "error_rate": round(timing["error_rate"], 6),
        })
    total_femtos = sum(sums[day]["cost_femtos"] for day in days.days)
    return form, {
        "timezone": tenant.timezone, "start": data["start"].isoformat(), "end": data["end"].isoformat(),
        "model": data.get("model") or None, "api_key": key.public_id if key else None, "days": rows,
        "total_spend_usd": usd_str(total_femtos),
    }


@login_required
def usage(request, slug: str):
    membership = membership_or_404(request, slug)
    form, data = _usage(request, membership)
    return render(request, "dashboard/usage.html", {
        "membership": membership, "tenant": membership.tenant, "page": "usage", "form": form, "usage": data,
        "charts": usage_charts(data["days"]) if data else None, "query": request.GET.urlencode(),
        "usage_table": usage_table_rows(data["days"]) if data else None,
    })


@login_required
def usage_csv(request, slug: str):
    membership = membership_or_404(request, slug)
    form, data = _usage(request, membership)
    if data is None:
        return HttpResponseBadRequest("Invalid range or filter: " + "; ".join(
            message for messages in form.errors.values() for message in messages), content_type="text/plain")
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="usage-{slug}-{data["start"]}-{data["end"]}.csv"'
    writer = csv.writer(response)
    writer.writerow([f"# timezone {data['timezone']}; model {data['model'] or 'all'}; "
                     f"api key {data['api_key'] or 'all'}"])
    writer.writerow(USAGE_COLUMNS)
    for row in data["days"]:
        writer.writerow([row[column] if row[column] is not None else "" for column in USAGE_COLUMNS])
    return response


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
