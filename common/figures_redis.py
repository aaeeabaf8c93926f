"""The Redis client of the live figures (common.live_counts, inference.metrics.timeline): one per process,
with short timeouts (a figure that cannot be counted now is skipped, never waited for), and the one way their
tests forget what is stored under a prefix."""

from __future__ import annotations

import threading

from django.conf import settings

_client = None
_client_lock = threading.Lock()


def figures_redis():
    """This process's client for settings.REDIS_URL (made on first use, and again if the setting changes)."""
    global _client
    url = settings.REDIS_URL
    held = _client
    if held is None or held[0] != url:
        with _client_lock:
            held = _client
            if held is None or held[0] != url:
                import redis

                held = _client = (url, redis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5))
    return held[1]


def figures_forget(kind: str) -> None:
    """Tests: delete every key of `kind` ("live", "timeline") under this deployment's prefix, if Redis is used."""
    if settings.REDIS_URL:
        client = figures_redis()
        for key in client.scan_iter(match=f"{settings.QUEUE_KEY_PREFIX}:{kind}:*", count=1000):
            client.delete(key)
