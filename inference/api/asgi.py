"""HTTP routing for the hot API paths: Django without its middleware stack or request_started.

Django runs every `MiddlewareMixin` middleware on an async request through
`sync_to_async(thread_sensitive=True)`: with the project's seven, that is about
a dozen hops per request through one shared thread, which measured 2.7 ms of
the 3.8 ms a rejected completion request took on the 2-core CI machine
(BENCHMARKS.md, serving). None of them does anything for these endpoints
(no sessions, cookies, CSRF, messages or templates; the views are
`csrf_exempt` and authenticate API keys themselves), so
`/v1/chat/completions` and `/v1/completions` go to a second Django handler
with an empty middleware chain. URL resolution, the views, request parsing and
exception handling are Django's own. The views validate the Host header and set
the security headers the skipped SecurityMiddleware would have set.

The handler also skips Django's `request_started` signal, whose sync
receivers cost another hop before the view (see `ApiASGIHandler.handle`).

A middleware that must see API traffic (none today) needs adding to
`API_MIDDLEWARE` below, async-capable so it costs no thread hop.
"""

from __future__ import annotations

import asyncio

from asgiref.sync import sync_to_async
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.handlers.exception import convert_exception_to_response
from django.urls import set_script_prefix

API_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})
API_MIDDLEWARE: list = []  # async middleware factories, outermost first


class ApiASGIHandler(ASGIHandler):
    """Django's ASGI handler with only `API_MIDDLEWARE` (none by default), sharing one sync thread.

    Django wraps each request in its own `ThreadSensitiveContext`, i.e. a fresh
    thread for the request's ORM calls, and database connections are
    per-thread: every request opened a new PostgreSQL connection (4 ms of a
    5.6 ms key check, measured). These endpoints make a few short autocommit
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
        Django sends it through a hop to the sync thread before every view:
        0.8 ms of the first token's time at 16 streams (BENCHMARKS.md,
        serving). Both also run at `request_finished`, which `response.close()`
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
        for factory in reversed(API_MIDDLEWARE):
            handler = convert_exception_to_response(factory(handler))
        self._middleware_chain = handler


def api_http_router(fallback):
    """An ASGI app sending API_PATHS to ApiASGIHandler and everything else to `fallback`."""
    api = ApiASGIHandler()

    async def app(scope, receive, send):
        if scope["type"] == "http" and scope.get("path") in API_PATHS:
            return await api(scope, receive, send)
        return await fallback(scope, receive, send)

    return app
