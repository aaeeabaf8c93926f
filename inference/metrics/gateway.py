"""The gateway's own metrics: HTTP responses by status, and requests refused before the queue by error code.

`http_metrics(app)` wraps the ASGI application (platform_site/asgi.py): it
reads the status of each response as it starts and counts it under a fixed
handler name (never the raw path, nor a method a client made up: both would
let clients create series). `refusal_count` is called by
`inference.api.services.ajob_submit` for every refusal between a valid
request and the queue: admission (`rate_limit_exceeded`,
`insufficient_quota`, `limits_unavailable`) and capacity (`model_unavailable`,
`queue_full`), for REST and WebSocket requests alike.
"""

from __future__ import annotations

import time

from prometheus_client import Counter

from . import PREFIX

HTTP_REQUESTS = Counter(f"{PREFIX}http_requests", "HTTP responses by handler, method and status code.",
                        ["handler", "method", "status"])
REFUSALS = Counter(f"{PREFIX}admission_refusals",
                   "Requests refused after validation and before the queue (admission limits, no worker, queue "
                   "full), by error code.", ["model_name", "tier", "code"])

_HANDLERS = {
    "/v1/chat/completions": "chat_completions",
    "/v1/completions": "completions",
    "/v1/models": "models",
    "/metrics": "metrics",
    "/health": "health",
    "/healthz": "healthz",
}
_PREFIXES = (
    ("/v1/models/", "models"), ("/v1/", "v1_other"), ("/admin/", "admin"), ("/billing/", "billing"),
    ("/dashboard/", "dashboard"), ("/accounts/", "dashboard"), ("/static/", "static"),
)
_METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"})


def handler_name(path: str) -> str:
    """A fixed name for the part of the site `path` belongs to."""
    name = _HANDLERS.get(path)
    if name is not None:
        return name
    for prefix, name in _PREFIXES:
        if path.startswith(prefix):
            return name
    return "other"


def refusal_count(*, model: str, tier: str, code: str | None) -> None:
    REFUSALS.labels(model, tier, code or "unknown").inc()


def http_metrics(app, *, every_s: float = 5.0):
    """`app` counting its HTTP responses; it also refreshes this process's figures (open files, memory,
    database connections: inference.metrics.live) at most every `every_s` seconds, on a response's start."""
    from .exposition import mark_dead_at_exit
    from .live import process_figures_update

    mark_dead_at_exit()
    next_update = [0.0]

    async def wrapped(scope, receive, send):
        if scope["type"] != "http":
            return await app(scope, receive, send)
        status = []

        async def send_counted(message):
            if message["type"] == "http.response.start" and not status:
                status.append(message["status"])
            await send(message)

        try:
            await app(scope, receive, send_counted)
        except Exception:
            if not status:  # the server answers 500 for an application that raised before its response
                status.append(500)
            raise
        finally:
            if status:
                method = scope.get("method", "")
                HTTP_REQUESTS.labels(handler_name(scope.get("path", "")),
                                     method if method in _METHODS else "other", str(status[0])).inc()
            now = time.monotonic()
            if now >= next_update[0]:
                next_update[0] = now + every_s
                process_figures_update()

    return wrapped
