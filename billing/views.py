"""An invoice as a printable HTML page and as a CSV of its lines (staff, or members of its tenant)."""

from __future__ import annotations

import csv

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse
from django.shortcuts import render

from billing.selectors import invoice_for_user

CSV_COLUMNS = ("position", "kind", "model", "price_id", "price_multiplier", "description", "quantity",
               "unit_price_per_million_usd", "exact_usd", "amount_usd")


def _invoice_or_404(request, invoice_id: str):
    invoice = invoice_for_user(user=request.user, public_id=invoice_id)
    if invoice is None:
        raise Http404("No such invoice")
    return invoice


@login_required
def invoice_html(request, invoice_id: str):
    invoice = _invoice_or_404(request, invoice_id)
    return render(request, "billing/invoice.html", {
        "invoice": invoice, "lines": list(invoice.lines.all()), "credit_notes": list(invoice.credit_notes.all()),
    })


@login_required
def invoice_csv(request, invoice_id: str):
    invoice = _invoice_or_404(request, invoice_id)
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{invoice.number}.csv"'
    writer = csv.writer(response)
    writer.writerow(CSV_COLUMNS)
    for line in invoice.lines.all():
        writer.writerow([line.position, line.kind, line.model, line.price_id or "", line.price_multiplier,
                         line.description, line.quantity, line.unit_price_per_million, line.exact_usd, line.amount])
    writer.writerow(["", "total", "", "", "", "", "", "", "", invoice.total])
    return response
