"""OpenAI-compatible usage and costs APIs, and invoices (scope usage:read; a key sees its own tenant only).

GET /v1/organization/usage/completions, GET /v1/organization/costs (the
shapes of OpenAI's organization usage API: UTC buckets, pages of buckets),
GET /v1/invoices, GET /v1/invoices/{id} (an invoice's public id, `inv_...`).
"""

from __future__ import annotations

import base64
import re
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone

from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from common.errors import InvalidRequest, NotFound
from billing.models import Invoice
from billing.models.invoices import PUBLIC_ID_PATTERN
from billing.money import usd_str
from billing.openapi import csv_list, window_parameters
from billing.selectors import invoices_of
from billing.usage_buckets import WIDTHS, Query, bucket_floor, usage_sums
from tenants.auth import HasScope
from tenants.models import ApiKey
from tenants.openapi import ref
from tenants.selectors import api_key_pks_of, api_key_public_ids

UTC = dt_timezone.utc
# OpenAI's limits on buckets per page: (default, maximum)
USAGE_LIMITS = {"1d": (7, 31), "1h": (24, 168), "1m": (60, 1440)}
COSTS_LIMITS = (7, 180)
USAGE_GROUPS = ("model", "api_key_id", "service_tier", "batch")
MAX_SECONDS = 2**37


def _list_param(request, name: str) -> list[str]:
    """`name=a&name=b`, `name[]=a` and `name=a,b` all give [a, b]. A NUL character is refused (400): no model or
    key id holds one, and PostgreSQL cannot compare a text with one (it would be a 500)."""
    values = request.query_params.getlist(name) + request.query_params.getlist(f"{name}[]")
    if any("\x00" in value for value in values):
        raise InvalidRequest(f"{name} must not contain NUL characters.", param=name)
    return [part for value in values for part in value.split(",") if part]


def _int_param(request, name: str, default: int | None = None, low: int = 0, high: int = MAX_SECONDS) -> int | None:
    raw = request.query_params.get(name)
    if raw in (None, ""):
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidRequest(f"{name} must be an integer, not {raw!r}.", param=name) from None
    if not low <= value <= high:
        raise InvalidRequest(f"{name} must be between {low} and {high}.", param=name)
    return value


def _page_start(request) -> datetime | None:
    token = request.query_params.get("page")
    if not token:
        return None
    try:
        return datetime.fromtimestamp(int(base64.urlsafe_b64decode(token.encode()).decode()), tz=UTC)
    except (ValueError, UnicodeDecodeError, OverflowError):
        raise InvalidRequest("page is not a next_page value this API returned.", param="page") from None


def _page_token(instant: datetime) -> str:
    return base64.urlsafe_b64encode(str(int(instant.timestamp())).encode()).decode()


def _window(request, width: str, limits: tuple[int, int]) -> tuple[datetime, datetime, datetime | None]:
    """(first bucket start, end of the page's last bucket, next page start or None)."""
    start_s = _int_param(request, "start_time")
    if start_s is None:
        raise InvalidRequest("start_time is required (Unix seconds).", param="start_time")
    end_s = _int_param(request, "end_time")
    limit = _int_param(request, "limit", default=limits[0], low=1, high=limits[1])
    end = datetime.fromtimestamp(end_s, tz=UTC) if end_s is not None else timezone.now()
    if end.timestamp() <= start_s:
        raise InvalidRequest("end_time must be after start_time.", param="end_time")
    start = bucket_floor(datetime.fromtimestamp(start_s, tz=UTC), width)
    start = max(start, _page_start(request) or start)
    step = WIDTHS[width]
    page_end = min(start + step * limit, end)
    last = bucket_floor(page_end - timedelta(microseconds=1), width) + step  # whole buckets
    return start, last, (last if last < end else None)


def _batch_param(request) -> bool | None:
    """`batch=true|false` (OpenAI's usage API): only Batch API lines, or only live requests; absent: both."""
    raw = request.query_params.get("batch")
    if raw in (None, ""):
        return None
    value = raw.strip().lower()
    if value not in ("true", "false"):
        raise InvalidRequest(f"batch must be true or false, not {raw!r}.", param="batch")
    return value == "true"


def _key_ids(request) -> tuple[int, ...] | None:
    """The row ids of the caller's keys named (by public id) in api_key_ids; None when none was named.

    An id that is not one of the tenant's keys matches nothing, as an unknown model name does."""
    public_ids = _list_param(request, "api_key_ids")
    if not public_ids:
        return None
    pks = api_key_pks_of(tenant=request.auth.tenant, public_ids=public_ids)
    return tuple(pks.values()) or (0,)


def _buckets(start: datetime, end: datetime, width: str):
    step, cursor = WIDTHS[width], start
    while cursor < end:
        yield cursor, cursor + step
        cursor += step


def _page(data: list, next_start: datetime | None) -> Response:
    return Response({"object": "page", "data": data, "has_more": next_start is not None,
                     "next_page": _page_token(next_start) if next_start else None})


def _public_key_ids(sums: dict, group_by: tuple[str, ...]) -> dict[int, str]:
    """pk -> public id of the keys in grouped sums (the API shows public ids only)."""
    if "api_key_id" not in group_by:
        return {}
    index = group_by.index("api_key_id")
    pks = {key[index] for groups in sums.values() for key in groups if key[index] is not None}
    return api_key_public_ids(pks=pks)


def _schema(component: str, parameters: list | None = None, summary: str = "", operation_id: str | None = None):
    return extend_schema(summary=summary, parameters=parameters or [], operation_id=operation_id,
                         responses={200: OpenApiResponse(response=ref(component))})


_USAGE_PARAMETERS = [
    *window_parameters(widths=tuple(USAGE_LIMITS), limits=(USAGE_LIMITS["1d"][0], max(m for _, m in USAGE_LIMITS.values())),
                       max_seconds=MAX_SECONDS),
    csv_list("group_by", "Group results by these fields.", {"enum": list(USAGE_GROUPS)}),
    csv_list("models", "Only these models."),
    csv_list("api_key_ids", "Only these API keys (public ids)."),
    OpenApiParameter("batch", {"type": "boolean"},
                     description="Only Batch API lines (true) or only live requests (false); default both."),
]
_COSTS_PARAMETERS = [
    *window_parameters(widths=("1d",), limits=COSTS_LIMITS, max_seconds=MAX_SECONDS),
    csv_list("group_by", "Group results by line item.", {"enum": ["line_item"]}),
]


class UsageCompletionsApi(APIView):
    permission_classes = [HasScope]
    required_scope = ApiKey.SCOPE_USAGE

    @_schema("UsagePage", _USAGE_PARAMETERS, "Completion usage in UTC buckets (OpenAI's organization usage API)")
    def get(self, request):
        width = request.query_params.get("bucket_width", "1d")
        if width not in USAGE_LIMITS:
            raise InvalidRequest("bucket_width must be one of 1m, 1h, 1d.", param="bucket_width")
        group_by = tuple(dict.fromkeys(_list_param(request, "group_by")))
        unknown = [g for g in group_by if g not in USAGE_GROUPS]
        if unknown:
            raise InvalidRequest(f"group_by supports {', '.join(USAGE_GROUPS)}; not {unknown[0]!r}.", param="group_by")
        start, end, next_start = _window(request, width, USAGE_LIMITS[width])
        query = Query(tenant=request.auth.tenant, start=start, end=end, width=width, group_by=group_by,
                      models=tuple(_list_param(request, "models")), api_key_ids=_key_ids(request) or (),
                      batch=_batch_param(request))
        sums = usage_sums(query)
        public_ids = _public_key_ids(sums, group_by)
        data = []
        for bucket_start, bucket_end in _buckets(start, end, width):
            results = []
            for key, figures in sorted(sums.get(bucket_start, {}).items(), key=lambda item: str(item[0])):
                group = dict(zip(group_by, key))
                results.append({
                    "object": "organization.usage.completions.result",
                    "input_tokens": figures["input_tokens"] + figures["cached_input_tokens"],
                    "input_cached_tokens": figures["cached_input_tokens"],
                    "output_tokens": figures["output_tokens"],
                    "input_audio_tokens": 0, "output_audio_tokens": 0,
                    "num_model_requests": figures["requests"],
                    "project_id": None, "user_id": None,
                    "api_key_id": public_ids.get(group.get("api_key_id")), "model": group.get("model"),
                    "service_tier": group.get("service_tier"),
                    "batch": bool(group["batch"]) if "batch" in group else None,
                })
            data.append({"object": "bucket", "start_time": int(bucket_start.timestamp()),
                         "end_time": int(bucket_end.timestamp()), "results": results})
        return _page(data, next_start)


_COST_KINDS = (("input", "input_cost_femtos"), ("cached input", "cached_input_cost_femtos"),
               ("output", "output_cost_femtos"))


def _amount(femtos: int) -> dict:
    exact = usd_str(femtos)
    # value is a JSON number as in OpenAI's API; value_decimal is the exact figure (an extension)
    return {"value": float(exact), "currency": "usd", "value_decimal": exact}


class CostsApi(APIView):
    permission_classes = [HasScope]
    required_scope = ApiKey.SCOPE_USAGE

    @_schema("CostsPage", _COSTS_PARAMETERS, "Costs in UTC day buckets (OpenAI's organization costs API)")
    def get(self, request):
        width = request.query_params.get("bucket_width", "1d")
        if width != "1d":
            raise InvalidRequest("bucket_width must be 1d for costs.", param="bucket_width")
        group_by = tuple(dict.fromkeys(_list_param(request, "group_by")))
        if any(g != "line_item" for g in group_by):
            raise InvalidRequest("group_by supports line_item.", param="group_by")
        start, end, next_start = _window(request, width, COSTS_LIMITS)
        query = Query(tenant=request.auth.tenant, start=start, end=end, width=width,
                      group_by=("model", "batch") if group_by else ())
        sums = usage_sums(query)
        data = []
        for bucket_start, bucket_end in _buckets(start, end, width):
            results = []
            for key, figures in sorted(sums.get(bucket_start, {}).items(), key=lambda item: str(item[0])):
                if group_by:
                    batch = "batch " if key[1] else ""  # Batch API lines: their own line items
                    results += [{"object": "organization.costs.result", "amount": _amount(figures[field]),
                                 "line_item": f"{key[0]}, {batch}{kind}", "project_id": None}
                                for kind, field in _COST_KINDS]
                else:
                    results.append({"object": "organization.costs.result", "amount": _amount(figures["cost_femtos"]),
                                    "line_item": None, "project_id": None})
            data.append({"object": "bucket", "start_time": int(bucket_start.timestamp()),
                         "end_time": int(bucket_end.timestamp()), "results": results})
        return _page(data, next_start)


def invoice_payload(invoice: Invoice, *, lines: bool) -> dict:
    body = {
        "id": invoice.public_id, "object": "invoice" if invoice.kind == Invoice.Kind.INVOICE else "credit_note",
        "number": invoice.number, "status": invoice.status, "period": invoice.period,
        "timezone": invoice.timezone, "period_start": int(invoice.period_start.timestamp()),
        "period_end": int(invoice.period_end.timestamp()), "currency": invoice.currency,
        "total": str(invoice.total), "corrects": invoice.corrects.public_id if invoice.corrects_id else None,
        "finalized_at": int(invoice.finalized_at.timestamp()) if invoice.finalized_at else None,
    }
    if lines:
        body["lines"] = [{
            "kind": line.kind, "model": line.model or None, "batch": line.batch, "price_id": line.price_id,
            "adjustment_id": line.adjustment_id,
            "price_multiplier": str(line.price_multiplier), "description": line.description,
            "quantity": line.quantity, "unit_price_per_million": line.unit_price_per_million or None,
            "exact": line.exact_usd, "amount": str(line.amount),
        } for line in invoice.lines.all()]
    return body


_INVOICE_ID = re.compile(PUBLIC_ID_PATTERN, re.ASCII)


class InvoiceListApi(APIView):
    permission_classes = [HasScope]
    required_scope = ApiKey.SCOPE_USAGE

    @_schema("InvoiceList", summary="The tenant's invoices and credit notes", operation_id="invoices_list")
    def get(self, request):
        invoices = invoices_of(tenant=request.auth.tenant).select_related("corrects")
        return Response({"object": "list", "data": [invoice_payload(i, lines=False) for i in invoices]})


class InvoiceDetailApi(APIView):
    permission_classes = [HasScope]
    required_scope = ApiKey.SCOPE_USAGE

    @_schema("InvoiceWithLines", summary="One invoice with its lines")
    def get(self, request, invoice_id: str):
        invoice = None
        if _INVOICE_ID.fullmatch(invoice_id):  # a public id, never a row id (nor "²", which isdigit() accepts)
            invoice = invoices_of(tenant=request.auth.tenant).select_related("corrects").filter(
                public_id=invoice_id).first()
        if invoice is None:
            raise NotFound(f"No invoice with id {invoice_id!r}.", param="id", code="invoice_not_found")
        return Response(invoice_payload(invoice, lines=True))
