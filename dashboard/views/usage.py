"""The tenant's usage page and its CSVs (per day, per model): a range, a model, a key and live or Batch API
requests to narrow it to.

Every figure is billing's (billing.selectors.usage_by_day_and_model, through dashboard.selectors.usage): the
days are the sums over the models, the models the sums over the days, so the page, its charts and both CSVs
reconcile with the ledger and with each other.
"""

from __future__ import annotations

import csv

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse, HttpResponseBadRequest
from django.shortcuts import render

from billing.selectors import days_between, today_in, usd_str
from dashboard.charts import spend_by_model_chart, usage_charts
from dashboard.forms import BATCH_FILTER, UsageFilterForm
from dashboard.selectors.usage import latency_by_day, models_in, models_used, usage_by_day_and_model, usage_totals
from dashboard.usage_table import by_model_rows, usage_table_rows
from dashboard.views.access import membership_or_404
from tenants.selectors import api_key_list

USAGE_COLUMNS = ("day", "requests", "input_tokens", "cached_input_tokens", "output_tokens", "spend_usd",
                 "ttft_p50_s", "ttft_p95_s", "errors", "error_rate")
BY_MODEL_COLUMNS = ("model", "requests", "input_tokens", "cached_input_tokens", "output_tokens", "spend_usd")


def _form(request, tenant) -> tuple[UsageFilterForm, list]:
    keys = list(api_key_list(tenant=tenant))
    form = UsageFilterForm(
        request.GET, models=models_used(tenant=tenant), keys=keys, today=today_in(tenant.timezone),
        models_in=lambda start, end: models_in(tenant=tenant,
                                               days=days_between(first=start, last=end, tz=tenant.timezone)))
    return form, keys


def _day_row(day, figures: dict, timing: dict) -> dict:
    return {
        "day": day.isoformat(), "requests": figures["requests"], "input_tokens": figures["input_tokens"],
        "cached_input_tokens": figures["cached_input_tokens"], "output_tokens": figures["output_tokens"],
        "spend_usd": usd_str(figures["cost_femtos"]), "ttft_p50_s": timing["ttft_p50_s"],
        "ttft_p95_s": timing["ttft_p95_s"], "errors": timing["errors"], "error_rate": round(timing["error_rate"], 6),
    }


def _usage(request, membership) -> tuple[UsageFilterForm, dict | None, dict | None]:
    """(form, the page's data island or None for an invalid form, {model: spend strings per day})."""
    tenant = membership.tenant
    form, keys = _form(request, tenant)
    if not form.is_valid():
        return form, None, None
    data = form.cleaned_data
    days = days_between(first=data["start"], last=data["end"], tz=tenant.timezone)
    models = (data["model"],) if data.get("model") else ()
    key = next((key for key in keys if key.public_id == data.get("key")), None)
    key_ids = (key.pk,) if key else ()
    batch = BATCH_FILTER[data.get("batch") or ""]  # only Batch API lines, only live requests, or both
    per_model = usage_by_day_and_model(tenant=tenant, days=days, models=models, api_key_ids=key_ids, batch=batch)
    sums = {day: usage_totals(per_model[day]) for day in days.days}
    latency = latency_by_day(tenant=tenant, days=days, models=models, api_key_ids=key_ids, batch=batch)
    names = sorted({name for by_model in per_model.values() for name in by_model})
    model_totals = {name: usage_totals({day: per_model[day][name] for day in days.days if name in per_model[day]})
                    for name in names}
    total = usage_totals(sums)
    spend = {name: [usd_str(per_model[day][name]["cost_femtos"] if name in per_model[day] else 0)
                    for day in days.days] for name in names}
    return form, {
        "timezone": tenant.timezone, "start": data["start"].isoformat(), "end": data["end"].isoformat(),
        "model": data.get("model") or None, "api_key": key.public_id if key else None, "batch": batch,
        "models": form.period_models, "days": [_day_row(day, sums[day], latency[day]) for day in days.days],
        "by_model": by_model_rows(model_totals, usd_str),
        "totals": {**{name: total[name] for name in BY_MODEL_COLUMNS[1:-1]},
                   "spend_usd": usd_str(total["cost_femtos"])},
        "total_spend_usd": usd_str(total["cost_femtos"]),
    }, spend


@login_required
def usage(request, slug: str):
    membership = membership_or_404(request, slug)
    form, data, spend = _usage(request, membership)
    charts = usage_charts(data["days"]) if data else None
    if data and len(spend) > 1:  # one model: the spend chart is already its picture
        charts["chart-spend-models"] = spend_by_model_chart([row["day"] for row in data["days"]], spend)
    return render(request, "dashboard/usage.html", {
        "membership": membership, "tenant": membership.tenant, "page": "usage", "form": form, "usage": data,
        "charts": charts, "query": request.GET.urlencode(),
        "usage_table": usage_table_rows(data["days"]) if data else None,
    })


def _csv(request, slug: str, name: str, columns: tuple[str, ...], rows_of) -> HttpResponse:
    membership = membership_or_404(request, slug)
    form, data, _ = _usage(request, membership)
    if data is None:
        return HttpResponseBadRequest("Invalid range or filter: " + "; ".join(
            message for messages in form.errors.values() for message in messages), content_type="text/plain")
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{name}-{slug}-{data["start"]}-{data["end"]}.csv"'
    writer = csv.writer(response)
    only = {True: "; Batch API requests only", False: "; live requests only", None: ""}[data["batch"]]
    writer.writerow([f"# timezone {data['timezone']}; model {data['model'] or 'all'}; "
                     f"api key {data['api_key'] or 'all'}{only}"])
    writer.writerow(columns)
    for row in rows_of(data):
        writer.writerow([row[column] if row[column] is not None else "" for column in columns])
    return response


@login_required
def usage_csv(request, slug: str):
    return _csv(request, slug, "usage", USAGE_COLUMNS, lambda data: data["days"])


@login_required
def usage_by_model_csv(request, slug: str):
    return _csv(request, slug, "usage-by-model", BY_MODEL_COLUMNS, lambda data: data["by_model"])
