"""The operator console's charts: the last hour as JSON, polled by the page (staff only, like the console)."""

from __future__ import annotations

import math

from django.http import JsonResponse

from common.errors import error_body
from dashboard.selectors.console_series import console_series


def console_series_json(request):
    """GET ?since=<seconds since the epoch>: the points from then on (all of the last hour without it)."""
    raw = request.GET.get("since")
    since = None
    if raw not in (None, ""):
        try:
            since = float(raw)
        except ValueError:
            since = math.nan
        if not math.isfinite(since):
            return JsonResponse(error_body("since must be a number of seconds since the epoch.",
                                           error_type="invalid_request_error", param="since", code="invalid_value"),
                                status=400)
    response = JsonResponse(console_series(since=since))
    response["Cache-Control"] = "no-store"
    return response
