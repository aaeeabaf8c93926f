from django.urls import path

import common.converters  # noqa: F401 - registers <public_id:> and <row_id:>
from billing import apis, views

urlpatterns = [
    path("v1/organization/usage/completions", apis.UsageCompletionsApi.as_view(), name="usage-completions"),
    path("v1/organization/costs", apis.CostsApi.as_view(), name="costs"),
    path("v1/invoices", apis.InvoiceListApi.as_view(), name="invoices"),
    # an id of another shape matches no route (404 unknown_url); a well-formed unknown one is invoice_not_found
    path("v1/invoices/<public_id:invoice_id>", apis.InvoiceDetailApi.as_view(), name="invoice-detail"),
    path("billing/invoices/<public_id:invoice_id>/", views.invoice_html, name="invoice-html"),
    path("billing/invoices/<public_id:invoice_id>.csv", views.invoice_csv, name="invoice-csv"),
]
