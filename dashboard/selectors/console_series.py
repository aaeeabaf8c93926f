"""The operator console's charts: the last hour as points, from the cheap live stores (no ledger query).

- every 10 s (inference.metrics.timeline): requests/s (endings), TTFT p50
  and p95 over the minute up to the point (the histograms of six buckets
  merged), queue depth per tier (summed over models), and per worker its
  KV-cache use, tokens/s and running requests;
- every minute (common.live_counts): API errors by code, admission refusals
  by kind, and worker errors (usage records ending in error, from the timeline).

A point without a heartbeat in its bucket has no queue or worker figures (a
gap in the chart, not a zero); one with a heartbeat and a tier missing from
the model's snapshot has nothing queued in that tier (0). `since` returns
only the points from then on (the page polls with it and merges).
"""

from __future__ import annotations

import time
from collections import defaultdict

from common.live_counts import BUCKET_S as MINUTE_S
from common.live_counts import ERRORS, REFUSALS, event_buckets
from inference.metrics.timeline import (BUCKET_S, DEPTH, KEEP_S, REQUESTS, TTFT, WORKER, WORKER_ERRORS,
                                        bucket_of, buckets_read, ttft_quantile)

TTFT_WINDOW_S = 60  # each point's percentiles cover the minute up to it
WORKER_ERROR_LABEL = "worker error"


def _ttft_counts(fields: dict) -> dict[int, int]:
    return {int(name[len(TTFT):]): count for name, count in fields.items() if name.startswith(TTFT)}


def _merged(histograms: list[dict[int, int]]) -> dict[int, int]:
    total: dict[int, int] = defaultdict(int)
    for histogram in histograms:
        for index, count in histogram.items():
            total[index] += count
    return total


def _point(t: int, fields: dict | None, ttft_window: list[dict[int, int]], tiers: set[str], now: float) -> dict:
    fields = fields or {}
    elapsed = min(BUCKET_S, max(1.0, now - t))  # the current bucket: the rate so far
    merged = _merged(ttft_window)
    p50, p95 = ttft_quantile(merged, 0.5), ttft_quantile(merged, 0.95)
    point = {"t": t, "requests_per_s": round(fields.get(REQUESTS, 0) / elapsed, 3),
             "ttft_p50_s": None if p50 is None else round(p50, 4),
             "ttft_p95_s": None if p95 is None else round(p95, 4),
             "queue_depth": None, "workers": {}}
    snapshots = [value for name, value in fields.items() if name.startswith(DEPTH) and isinstance(value, dict)]
    if snapshots:
        depth = dict.fromkeys(tiers, 0)
        for snapshot in snapshots:
            for tier, count in snapshot.items():
                depth[tier] = depth.get(tier, 0) + int(count)
        point["queue_depth"] = depth
    for name, value in fields.items():
        if name.startswith(WORKER) and isinstance(value, dict):
            point["workers"][name[len(WORKER):]] = {key: value.get(key) for key in ("model", "kv_usage", "tok_s",
                                                                                    "running")}
    return point


def _events(first: float, now: float, worker_errors: dict[int, int]) -> list[dict]:
    window = int(now - first) + MINUTE_S
    errors = event_buckets(ERRORS, window_s=window, now=now)
    refusals = event_buckets(REFUSALS, window_s=window, now=now)
    start = int(first // MINUTE_S) * MINUTE_S
    out = []
    for minute in range(start, int(now // MINUTE_S) * MINUTE_S + 1, MINUTE_S):
        minute_errors = dict(errors.get(minute, {}))
        if worker_errors.get(minute):
            minute_errors[WORKER_ERROR_LABEL] = worker_errors[minute]
        out.append({"t": minute, "errors": minute_errors, "refusals": refusals.get(minute, {})})
    return out


def console_series(*, since: float | None = None, now: float | None = None) -> dict:
    """{"bucket_s", "minute_s", "window_s", "now", "points": [...], "events": [...]}, JSON-ready; times in
    seconds since the epoch (UTC), each point's `t` the start of its bucket."""
    now = time.time() if now is None else now
    earliest = bucket_of(now - KEEP_S) + BUCKET_S
    first = earliest if since is None else min(max(bucket_of(since), earliest), bucket_of(now))
    buckets = buckets_read(first=first - TTFT_WINDOW_S + BUCKET_S, last=now)
    tiers = {tier for fields in buckets.values() for name, value in fields.items()
             if name.startswith(DEPTH) and isinstance(value, dict) for tier in value}
    histograms = {t: _ttft_counts(fields) for t, fields in buckets.items()}
    points = []
    for t in range(first, bucket_of(now) + 1, BUCKET_S):
        window = [histograms.get(b, {}) for b in range(t - TTFT_WINDOW_S + BUCKET_S, t + 1, BUCKET_S)]
        points.append(_point(t, buckets.get(t), window, tiers, now))
    worker_errors: dict[int, int] = defaultdict(int)
    for t, fields in buckets.items():
        if t >= first // MINUTE_S * MINUTE_S and fields.get(WORKER_ERRORS):  # whole minutes (read from first-50 s)
            worker_errors[t // MINUTE_S * MINUTE_S] += fields[WORKER_ERRORS]
    return {"bucket_s": BUCKET_S, "minute_s": MINUTE_S, "window_s": KEEP_S, "now": round(now, 3),
            "points": points, "events": _events(first, now, worker_errors)}
