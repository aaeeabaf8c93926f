"""OpenAI-shaped errors: {"error": {"message", "type", "param", "code"}}.

Every error a client can cause goes through `ApiError` (or a DRF exception,
translated by `openai_exception_handler`), so bodies and status codes agree
across REST views, SSE streams and WebSocket frames.
"""

from __future__ import annotations

from typing import Any

from django.http import JsonResponse
from rest_framework import exceptions as drf_exceptions
from rest_framework.response import Response


class ApiError(Exception):
    status_code = 400
    error_type = "invalid_request_error"
    code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        status: int | None = None,
        error_type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        if status is not None:
            self.status_code = status
        if error_type is not None:
            self.error_type = error_type
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.message, error_type=self.error_type, param=self.param, code=self.code)


class InvalidRequest(ApiError):
    status_code = 400
    error_type = "invalid_request_error"


class AuthenticationError(ApiError):
    status_code = 401
    error_type = "invalid_request_error"
    code = "invalid_api_key"


class PermissionDenied(ApiError):
    status_code = 403
    error_type = "permission_error"


class NotFound(ApiError):
    status_code = 404
    error_type = "invalid_request_error"
    code = "model_not_found"


class RateLimited(ApiError):
    status_code = 429
    error_type = "rate_limit_error"
    code = "rate_limit_exceeded"


class InsufficientQuota(ApiError):
    status_code = 429
    error_type = "insufficient_quota"
    code = "insufficient_quota"


class ServiceUnavailable(ApiError):
    status_code = 503
    error_type = "server_error"
    code = "no_capacity"


def error_body(message: str, *, error_type: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def count_error(status: int, body: dict) -> None:
    """The operator console's errors by code (common.live_counts): every error the API sends, as a
    response here, or mid-stream (an SSE error event, a WebSocket error frame) where those are sent."""
    from common.live_counts import ERRORS, count_event

    error = body.get("error") or {}
    count_event(ERRORS, f"{status} {error.get('code') or error.get('type') or 'error'}")


def error_json_response(exc: ApiError) -> JsonResponse:
    body = exc.body()
    count_error(exc.status_code, body)
    response = JsonResponse(body, status=exc.status_code)
    for name, value in exc.headers.items():
        response[name] = value
    return response


_DRF_MAP: dict[type, tuple[int, str, str | None]] = {
    drf_exceptions.NotAuthenticated: (401, "invalid_request_error", "invalid_api_key"),
    drf_exceptions.AuthenticationFailed: (401, "invalid_request_error", "invalid_api_key"),
    drf_exceptions.PermissionDenied: (403, "permission_error", "permission_denied"),
    drf_exceptions.NotFound: (404, "invalid_request_error", "not_found"),
    drf_exceptions.MethodNotAllowed: (405, "invalid_request_error", "method_not_allowed"),
    drf_exceptions.UnsupportedMediaType: (415, "invalid_request_error", "unsupported_media_type"),
    drf_exceptions.ParseError: (400, "invalid_request_error", "invalid_json"),
    drf_exceptions.Throttled: (429, "rate_limit_error", "rate_limit_exceeded"),
}


def _flatten_detail(detail: Any) -> tuple[str, str | None]:
    """First message of a DRF ValidationError detail, with the field as param."""
    if isinstance(detail, dict):
        for key, value in detail.items():
            message, sub = _flatten_detail(value)
            param = key if key != "non_field_errors" else None
            if sub and param:
                param = f"{param}.{sub}"
            return message, param or sub
        return "Invalid request.", None
    if isinstance(detail, list):
        if not detail:
            return "Invalid request.", None
        return _flatten_detail(detail[0])
    return str(detail), None


def openai_exception_handler(exc: Exception, context: dict) -> Response | None:
    """DRF EXCEPTION_HANDLER: every client-caused error in the OpenAI shape (and counted by code)."""
    response = _drf_error_response(exc)
    if response is not None:
        count_error(response.status_code, response.data)
    return response


def _drf_error_response(exc: Exception) -> Response | None:
    if isinstance(exc, ApiError):
        return Response(exc.body(), status=exc.status_code, headers=exc.headers or None)
    if isinstance(exc, drf_exceptions.ValidationError):
        message, param = _flatten_detail(exc.detail)
        return Response(error_body(message, error_type="invalid_request_error", param=param, code="invalid_value"), status=400)
    for cls, (status, error_type, code) in _DRF_MAP.items():
        if isinstance(exc, cls):
            message, _ = _flatten_detail(getattr(exc, "detail", str(exc)))
            headers = {}
            wait = getattr(exc, "wait", None)
            if wait:
                headers["Retry-After"] = str(int(wait) + 1)
            return Response(error_body(message, error_type=error_type, code=code), status=status, headers=headers or None)
    if isinstance(exc, drf_exceptions.APIException):
        message, _ = _flatten_detail(exc.detail)
        return Response(error_body(message, error_type="invalid_request_error", code=exc.default_code), status=exc.status_code)
    return None


def _wants_api_error(request) -> bool:
    return request.path.startswith("/v1/") or "application/json" in request.headers.get("Accept", "")


def handler404(request, exception=None):
    """Unknown paths under /v1/ answer in the OpenAI shape (HTML elsewhere)."""
    if _wants_api_error(request):
        message = f"Unknown request URL: {request.method} {request.path}."
        return JsonResponse(error_body(message, error_type="invalid_request_error", code="unknown_url"), status=404)
    from django.views.defaults import page_not_found

    return page_not_found(request, exception)


def handler500(request):
    if _wants_api_error(request):
        message = "The server had an error while processing your request."
        return JsonResponse(error_body(message, error_type="server_error", code="internal_error"), status=500)
    from django.views.defaults import server_error

    return server_error(request)
