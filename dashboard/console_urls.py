"""The console's URLs, mounted under /admin/console/ and wrapped in the admin's staff check."""

from django.contrib import admin
from django.urls import path

from dashboard.views import console, console_series

urlpatterns = [
    path("", admin.site.admin_view(console.console), name="admin-console"),
    path("summary.json", admin.site.admin_view(console.console_summary_json), name="admin-console-summary"),
    path("series.json", admin.site.admin_view(console_series.console_series_json), name="admin-console-series"),
]
