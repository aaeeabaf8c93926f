"""The operator console: staff-only views inside the admin (its login, its look), refreshing itself."""

from __future__ import annotations

from django.contrib import admin
from django.http import JsonResponse
from django.template.response import TemplateResponse

from dashboard.selectors.console import console_summary

REFRESH_S = 3


def console(request):
    return TemplateResponse(request, "admin/console.html", {
        **admin.site.each_context(request), "title": "Operator console", "summary": console_summary(),
        "refresh_ms": REFRESH_S * 1000,
    })


def console_summary_json(request):
    response = JsonResponse(console_summary())
    response["Cache-Control"] = "no-store"
    return response
