"""HTTP routing for the hot API paths: Django without the thread hops of its middleware stack.

Django runs every `MiddlewareMixin` middleware on an async request through
`sync_to_async(thread_sensitive=True)`: with the project's seven, about a
dozen hops per request through one shared thread, before and after the view
(`benchmarks/asgi_stack.py` measures what that costs; it is far above what the
first token can spare). So `/v1/chat/completions` and `/v1/completions` go to
a second Django handler that applies the same stack without the hops: each
entry of settings.MIDDLEWARE is either

- run inline (`INLINE`): Django's own class, its `process_request` and
  `process_response` called on the event loop, which is safe because they do
  no I/O (security headers, the SSL redirect, Content-Length, X-Frame-Options);
  CommonMiddleware's Host check is left to the views, which answer a bad Host
  with the OpenAI error body (`_ApiCommonMiddleware`);
- or left out (`NOT_NEEDED`): it has nothing to do for these views (they are
  `csrf_exempt`, authenticate API keys themselves, touch no session, user
  or message, log nobody in, and answer every error in the OpenAI shape).

A middleware in neither set sends the API paths back to Django's standard
handler (with a warning) rather than skipping it. tests/inference/test_api_asgi.py
sends the same requests through both handlers and fails if the responses
differ. URL resolution, the views, request parsing (the
DATA_UPLOAD_MAX_MEMORY_SIZE limit included) and exception handling are Django's own.

The handler also skips Django's `request_started` signal, whose sync
receivers cost another hop before the view (see `ApiASGIHandler.handle`).
"""

from __future__ import annotations

import asyncio
import logging

from asgiref.sync import markcoroutinefunction, sync_to_async
from django.conf import settings
from django.core import signals
from django.core.exceptions import DisallowedHost, ImproperlyConfigured, RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.handlers.exception import convert_exception_to_response
from django.middleware.common import CommonMiddleware
from django.urls import set_script_prefix
from django.utils.module_loading import import_string

logger = logging.getLogger(__name__)

API_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})


class _ApiCommonMiddleware(CommonMiddleware):
    """CommonMiddleware, less the refusal of a bad Host: the views refuse it with the OpenAI error body."""

    def process_request(self, request):
        try:
            return super().process_request(request)
        except DisallowedHost:
            return None


# settings.MIDDLEWARE entries whose hooks the API paths run on the event loop (sync, no I/O)
INLINE = {
    "django.middleware.security.SecurityMiddleware": "django.middleware.security.SecurityMiddleware",
    "django.middleware.common.CommonMiddleware": f"{__name__}._ApiCommonMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware": "django.middleware.clickjacking.XFrameOptionsMiddleware",
}
# settings.MIDDLEWARE entries with nothing to do for the completion views
NOT_NEEDED = frozenset({
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "common.middleware.ApiErrorShapeMiddleware",  # the completion views answer every error in the shape
    "axes.middleware.AxesMiddleware",  # login throttling: these views log nobody in
})


def api_middleware_unknown() -> list[str]:
    """The settings.MIDDLEWARE entries the API handler cannot apply (then the API paths use Django's)."""
    return [path for path in settings.MIDDLEWARE if path not in INLINE and path not in NOT_NEEDED]


def _inline(middleware):
    """`MiddlewareMixin.__acall__` without its two `sync_to_async` hops."""

    async def call(request):
        response = None
        if hasattr(middleware, "process_request"):
            response = middleware.process_request(request)
        response = response or await middleware.get_response(request)
        if hasattr(middleware, "process_response"):
            response = middleware.process_response(request, response)
        return response

    return markcoroutinefunction(call)


class ApiASGIHandler(ASGIHandler):
    """Django's ASGI handler with the `INLINE` middleware run on the loop, sharing one sync thread.

    Django wraps each request in its own `ThreadSensitiveContext`, i.e. a fresh
    thread for the request's ORM calls, and database connections are
    per-thread: every request would open a new PostgreSQL connection, most of
    the cost of a key check that misses the cache. These endpoints make a few short autocommit
    queries and keep no thread-local state, so their sync calls share asgiref's
    process-wide thread, whose connection goes back to the pool (PostgreSQL,
    settings.DB_POOL) or is closed at each request's end.
    """

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            raise ValueError(f"ApiASGIHandler cannot handle {scope['type']!r} connections")
        await self.handle(scope, receive, send)

    async def handle(self, scope, receive, send):
        """Django's `ASGIHandler.handle` (5.2) less the `request_started` signal.

        Its receivers (`close_old_connections`, `reset_queries`) are sync, so
        Django sends it through a hop to the sync thread before every view, on
        the way to the first token. Both also run at `request_finished`, which `response.close()`
        sends on the same shared thread these requests' queries use, so every
        request still finds the connections checked, at the previous request's
        end. The rest is Django's: a client disconnecting while the view runs
        cancels the view (and so the job), and the response is closed once.
        """
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        set_script_prefix(get_script_prefix(scope))
        request, error_response = self.create_request(scope, body_file)
        if request is None:
            body_file.close()
            await self.send_response(error_response, send)
            await sync_to_async(error_response.close)()
            return

        async def process_request():
            response = await self.run_get_response(request)
            try:
                await self.send_response(response, send)
            except asyncio.CancelledError:
                pass  # the client left while the response was being sent
            return response

        listener = asyncio.create_task(self.listen_for_disconnect(receive))
        processor = asyncio.create_task(process_request())
        await asyncio.wait((listener, processor), return_when=asyncio.FIRST_COMPLETED)
        for task in (listener, processor):  # the listener first: a disconnect cancels the view
            if task.done():
                try:
                    task.result()
                except RequestAborted:
                    pass
                except AssertionError:
                    body_file.close()
                    raise
            else:
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
        try:
            response = processor.result()
        except asyncio.CancelledError:
            await signals.request_finished.asend(sender=self.__class__)
        else:
            await sync_to_async(response.close)()
        body_file.close()

    def load_middleware(self, is_async: bool = False) -> None:
        self._view_middleware = []
        self._template_response_middleware = []
        self._exception_middleware = []
        handler = convert_exception_to_response(self._get_response_async)
        for path in reversed(settings.MIDDLEWARE):
            if path in NOT_NEEDED:
                continue
            if path not in INLINE:
                raise ImproperlyConfigured(f"{path}: the API handler cannot apply it (see api_http_router)")
            handler = convert_exception_to_response(_inline(import_string(INLINE[path])(handler)))
        self._middleware_chain = handler


def api_http_router(fallback):
    """An ASGI app sending API_PATHS to ApiASGIHandler and everything else to `fallback`."""
    unknown = api_middleware_unknown()
    if unknown:
        logger.warning("the API paths go through Django's middleware stack: %s is neither in "
                       "inference.api.asgi.INLINE nor NOT_NEEDED", ", ".join(unknown))
        return fallback
    api = ApiASGIHandler()

    async def app(scope, receive, send):
        if scope["type"] == "http" and scope.get("path") in API_PATHS:
            return await api(scope, receive, send)
        return await fallback(scope, receive, send)

    return app
