"""Counts of recent events (API errors by code, admission refusals by kind) for the operator console.

Events are counted in one-minute buckets kept for an hour: in Redis when
REDIS_URL is set (every web process adds to the same hash, one round trip
per event), else in this process (the embedded mode is one process).
Counting never fails a request: a Redis error drops the event, and an outage is logged once
(common.outage), not once per dropped event.
The durable record of what happened stays the usage ledger; these are the
live figures Prometheus (`/metrics`) also exports, kept where a page can read them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict

from django.conf import settings

from common.figures_redis import figures_forget, figures_redis
from common.outage import Outage

logger = logging.getLogger(__name__)

BUCKET_S = 60
KEEP_S = 3600
ERRORS = "errors"  # label: the error's code (or type)
REFUSALS = "refusals"  # label: the admission limit that refused (requests, tokens, concurrency, quota, spend)

_lock = threading.Lock()
_memory: dict[tuple[str, int], dict[str, int]] = defaultdict(lambda: defaultdict(int))
_outage = Outage(logger, "live counts (Redis)")


def _key(kind: str, bucket: int) -> str:
    return f"{settings.QUEUE_KEY_PREFIX}:live:{kind}:{bucket}"


def count_event(kind: str, label: str, *, now: float | None = None) -> None:
    bucket = int((now or time.time()) // BUCKET_S)
    label = str(label or "none")[:60]
    if not settings.REDIS_URL:
        with _lock:
            _memory[(kind, bucket)][label] += 1
            for stale in [k for k in _memory if k[1] <= bucket - KEEP_S // BUCKET_S]:
                del _memory[stale]
        return
    try:
        pipe = figures_redis().pipeline(transaction=False)
        pipe.hincrby(_key(kind, bucket), label, 1)
        pipe.expire(_key(kind, bucket), KEEP_S + BUCKET_S)
        pipe.execute()
    except Exception as exc:  # noqa: BLE001 - a live figure is never worth a failed request
        _outage.failed(f"counts dropped from {kind}/{label} on: {exc}")  # said once per outage, not per event
    else:
        _outage.ok()


def event_counts(kind: str, *, window_s: int = KEEP_S, now: float | None = None) -> dict[str, int]:
    """label -> events in the last `window_s` seconds (whole minutes, the current one included)."""
    last = int((now or time.time()) // BUCKET_S)
    buckets = range(last - max(1, window_s // BUCKET_S) + 1, last + 1)
    totals: dict[str, int] = defaultdict(int)
    if not settings.REDIS_URL:
        with _lock:
            for bucket in buckets:
                for label, count in _memory.get((kind, bucket), {}).items():
                    totals[label] += count
        return dict(totals)
    try:
        pipe = figures_redis().pipeline(transaction=False)
        for bucket in buckets:
            pipe.hgetall(_key(kind, bucket))
        for counts in pipe.execute():
            for label, count in counts.items():
                totals[label.decode()] += int(count)
    except Exception as exc:  # noqa: BLE001
        logger.warning("live counts %s unreadable: %s", kind, exc)
    return dict(totals)


def event_buckets(kind: str, *, window_s: int = KEEP_S, now: float | None = None) -> dict[int, dict[str, int]]:
    """minute start (seconds since the epoch) -> label -> events, for the minutes of the last `window_s` seconds
    that hold any (the operator console's charts; `event_counts` sums the same buckets)."""
    last = int((now or time.time()) // BUCKET_S)
    buckets = list(range(last - max(1, window_s // BUCKET_S) + 1, last + 1))
    out: dict[int, dict[str, int]] = {}
    if not settings.REDIS_URL:
        with _lock:
            for bucket in buckets:
                if _memory.get((kind, bucket)):
                    out[bucket * BUCKET_S] = dict(_memory[(kind, bucket)])
        return out
    try:
        pipe = figures_redis().pipeline(transaction=False)
        for bucket in buckets:
            pipe.hgetall(_key(kind, bucket))
        for bucket, counts in zip(buckets, pipe.execute()):
            if counts:
                out[bucket * BUCKET_S] = {label.decode(): int(count) for label, count in counts.items()}
    except Exception as exc:  # noqa: BLE001
        logger.warning("live counts %s unreadable: %s", kind, exc)
    return out


def live_counts_clear() -> None:
    """Tests: forget the counts (in this process, or under this prefix in Redis)."""
    with _lock:
        _memory.clear()
    figures_forget("live")
