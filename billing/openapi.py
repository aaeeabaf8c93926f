"""OpenAPI pieces of the usage, costs and invoices APIs (see tenants/openapi.py for how they are used)."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter

from tenants.openapi import ref

_NULL = {"type": "null"}
_STRING_OR_NULL = {"type": ["string", "null"]}


def _page(result: str) -> dict:
    bucket = {
        "type": "object", "required": ["object", "start_time", "end_time", "results"],
        "properties": {"object": {"const": "bucket"}, "start_time": {"type": "integer"},
                       "end_time": {"type": "integer"}, "results": {"type": "array", "items": ref(result)}},
    }
    return {
        "type": "object", "required": ["object", "data", "has_more", "next_page"],
        "properties": {"object": {"const": "page"}, "data": {"type": "array", "items": bucket},
                       "has_more": {"type": "boolean"}, "next_page": _STRING_OR_NULL},
    }


_COUNT = {"type": "integer", "minimum": 0}
_INVOICE_PROPERTIES = {
    "id": {"type": "string", "pattern": "^inv_[A-Za-z0-9]{20}$", "description": "The invoice's public id"}, "object": {"enum": ["invoice", "credit_note"]}, "number": {"type": "string"},
    "status": {"type": "string"}, "period": {"type": "string"}, "timezone": {"type": "string"},
    "period_start": {"type": "integer"}, "period_end": {"type": "integer"}, "currency": {"type": "string"},
    "total": {"type": "string", "description": "Decimal amount"}, "corrects": {"type": ["string", "null"], "description": "The public id of the invoice a credit note corrects"},
    "finalized_at": {"type": ["integer", "null"]},
}

COMPONENTS = {
    "UsageResult": {
        "type": "object",
        "required": ["object", "input_tokens", "input_cached_tokens", "output_tokens", "num_model_requests"],
        "properties": {
            "object": {"const": "organization.usage.completions.result"},
            "input_tokens": _COUNT, "input_cached_tokens": _COUNT, "output_tokens": _COUNT,
            "input_audio_tokens": _COUNT, "output_audio_tokens": _COUNT, "num_model_requests": _COUNT,
            "project_id": _NULL, "user_id": _NULL,
            "batch": {"type": ["boolean", "null"], "description": "With group_by=batch: Batch API lines (true) "
                                                                  "or live requests (false)"},
            "api_key_id": _STRING_OR_NULL, "model": _STRING_OR_NULL, "service_tier": _STRING_OR_NULL,
        },
    },
    "UsagePage": _page("UsageResult"),
    "CostResult": {
        "type": "object", "required": ["object", "amount", "line_item"],
        "properties": {
            "object": {"const": "organization.costs.result"},
            "amount": {"type": "object", "required": ["value", "currency", "value_decimal"],
                       "properties": {"value": {"type": "number"}, "currency": {"const": "usd"},
                                      "value_decimal": {"type": "string"}}},
            "line_item": _STRING_OR_NULL, "project_id": _NULL,
        },
    },
    "CostsPage": _page("CostResult"),
    "Invoice": {"type": "object", "required": list(_INVOICE_PROPERTIES), "properties": _INVOICE_PROPERTIES},
    "InvoiceWithLines": {
        "allOf": [ref("Invoice"), {"type": "object", "required": ["lines"], "properties": {
            "lines": {"type": "array", "items": {"type": "object", "required": ["kind", "quantity", "amount"]}}}}],
    },
    "InvoiceList": {
        "type": "object", "required": ["object", "data"],
        "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": ref("Invoice")}},
    },
}


def csv_list(name: str, description: str, items: dict | None = None) -> OpenApiParameter:
    """A query parameter taking several values (`a,b`, or repeated)."""
    return OpenApiParameter(name, {"type": "array", "items": items or {"type": "string", "minLength": 1}},
                            description=description, explode=False, style="form")


def window_parameters(*, widths: tuple[str, ...], limits: tuple[int, int], max_seconds: int) -> list[OpenApiParameter]:
    """start_time, end_time, bucket_width, limit, page (billing.apis._window)."""
    seconds = {"type": "integer", "minimum": 0, "maximum": max_seconds}
    return [
        OpenApiParameter("start_time", seconds, required=True, description="Unix seconds (inclusive)."),
        OpenApiParameter("end_time", seconds, description="Unix seconds (exclusive), after start_time; default now."),
        OpenApiParameter("bucket_width", {"enum": list(widths)}, description="Bucket width; default 1d."),
        OpenApiParameter("limit", {"type": "integer", "minimum": 1, "maximum": limits[1]},
                         description=f"Buckets per page (default {limits[0]}; the maximum depends on the width)."),
        OpenApiParameter("page", {"type": "string"}, description="The next_page of the previous page."),
    ]
