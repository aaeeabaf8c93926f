"""The operator console: staff-only views inside the admin (its login, its look), refreshing itself.

Revenue and the top tenants by spend are shown (and computed) only for users with
`dashboard.view_revenue` (dashboard.models.Console); every other figure to all staff.
"""

from __future__ import annotations

from django.contrib import admin
from django.http import JsonResponse
from django.template.response import TemplateResponse

from dashboard.selectors.console import console_summary

REFRESH_S = 3
REVENUE_PERMISSION = "dashboard.view_revenue"


def can_view_revenue(user) -> bool:
    return user.has_perm(REVENUE_PERMISSION)


def console(request):
    revenue = can_view_revenue(request.user)
    return TemplateResponse(request, "admin/console.html", {
        **admin.site.each_context(request), "title": "Operator console",
        "summary": console_summary(revenue=revenue), "can_view_revenue": revenue, "refresh_ms": REFRESH_S * 1000,
    })


def console_summary_json(request):
    response = JsonResponse(console_summary(revenue=can_view_revenue(request.user)))
    response["Cache-Control"] = "no-store"
    return response
