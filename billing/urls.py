from django.urls import path

from billing import apis, views

urlpatterns = [
    path("v1/organization/usage/completions", apis.UsageCompletionsApi.as_view(), name="usage-completions"),
    path("v1/organization/costs", apis.CostsApi.as_view(), name="costs"),
    path("v1/invoices", apis.InvoiceListApi.as_view(), name="invoices"),
    path("v1/invoices/<str:invoice_id>", apis.InvoiceDetailApi.as_view(), name="invoice-detail"),
    path("billing/invoices/<int:invoice_id>/", views.invoice_html, name="invoice-html"),
    path("billing/invoices/<int:invoice_id>.csv", views.invoice_csv, name="invoice-csv"),
]
