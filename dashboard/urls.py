from django.urls import path

import common.converters  # noqa: F401 - registers <public_id:> and <row_id:>
from dashboard.views import assets, batches, keys, pages, usage

app_name = "dashboard"

urlpatterns = [
    path("", pages.home, name="home"),
    path("assets/plotly.min.js", assets.plotly_js, name="plotly-js"),
    path("<slug:slug>/", pages.overview, name="overview"),
    path("<slug:slug>/usage/", usage.usage, name="usage"),
    path("<slug:slug>/usage.csv", usage.usage_csv, name="usage-csv"),
    path("<slug:slug>/usage-by-model.csv", usage.usage_by_model_csv, name="usage-by-model-csv"),
    path("<slug:slug>/keys/", keys.keys, name="keys"),
    path("<slug:slug>/keys/<public_id:key_id>/revoke/", keys.key_revoke, name="key-revoke"),
    path("<slug:slug>/settings/", keys.tenant_settings, name="settings"),
    path("<slug:slug>/settings/alerts/", keys.budget_alerts, name="budget-alerts"),
    path("<slug:slug>/invoices/", pages.invoices, name="invoices"),
    path("<slug:slug>/invoices/<public_id:invoice_id>/", pages.invoice_detail, name="invoice"),
    path("<slug:slug>/batches/", batches.batches, name="batches"),
    path("<slug:slug>/files/<public_id:file_id>/", batches.file_download, name="file"),
]
