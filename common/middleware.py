"""Errors under /v1 in the OpenAI shape, whatever produced them.

The views and DRF's exception handler already answer in the shape; what is
left are Django's own answers, which are HTML: the 404 of a URL no pattern
matches (under DEBUG the technical page, which `handler404` does not replace),
the 405 of a view limited with `require_http_methods`, the 400 of a bad Host
or a refused upload, DEBUG's technical 500. The SDK shows those as a bare
"Error code: 404". This middleware turns any such non-JSON error response of a
path under /v1 into `{"error": {...}}` with the same status and headers
(`Allow` of a 405 included), so every path under /v1 speaks one language.
"""

from __future__ import annotations

from http import HTTPStatus

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import JsonResponse

from common.errors import error_body

_CODES = {
    400: ("invalid_request_error", "bad_request"),
    403: ("permission_error", "permission_denied"),
    404: ("invalid_request_error", "unknown_url"),
    405: ("invalid_request_error", "method_not_allowed"),
    408: ("invalid_request_error", "request_timeout"),
    413: ("invalid_request_error", "request_too_large"),
}
_KEPT_HEADERS = ("Allow", "Retry-After", "WWW-Authenticate")


def is_api_path(path: str) -> bool:
    return path == "/v1" or path.startswith("/v1/")


def api_error_response(*, method: str, path: str, status: int) -> JsonResponse:
    """The OpenAI-shaped body for a status Django answered without one."""
    error_type, code = _CODES.get(status, ("server_error" if status >= 500 else "invalid_request_error", None))
    if status == 404:
        message = f"Unknown request URL: {method} {path}."
    elif status == 405:
        message = f"Method {method} is not allowed for {path}."
    else:
        try:
            message = f"{HTTPStatus(status).phrase}."
        except ValueError:
            message = "The request could not be served."
        if status >= 500:
            message = "The server had an error while processing your request."
    return JsonResponse(error_body(message, error_type=error_type, code=code), status=status)


class ApiErrorShapeMiddleware:
    """Replaces a non-JSON error response (status >= 400) of a /v1 path by the OpenAI error body.

    Sync and async capable, with no thread hop on either path (it does no I/O).
    """

    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        self._async = iscoroutinefunction(get_response)
        if self._async:
            markcoroutinefunction(self)

    def __call__(self, request):
        if self._async:
            return self._acall(request)
        return self._shaped(request, self.get_response(request))

    async def _acall(self, request):
        return self._shaped(request, await self.get_response(request))

    @staticmethod
    def _shaped(request, response):
        if response.status_code < 400 or not is_api_path(request.path):
            return response
        if response.get("Content-Type", "").startswith("application/json") or response.streaming:
            return response
        shaped = api_error_response(method=request.method, path=request.path, status=response.status_code)
        for name in _KEPT_HEADERS:
            if name in response:
                shaped[name] = response[name]
        for cookie in response.cookies.values():
            shaped.cookies[cookie.key] = cookie
        return shaped
