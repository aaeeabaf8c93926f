"""The last hour in 10-second buckets, for the operator console's charts.

What writes here already counts these figures for Prometheus, at no extra read:
- `requests_add(records)`: every request's ending (`inference.worker.finish`,
  beside `requests_observe`): a count, a worker-error count, and its time to
  first token in a log-spaced histogram (4 bins per doubling from 1 ms, so a
  percentile read from it is within one bin, about 19 %, of the exact one);
- `worker_sample(...)`: each worker heartbeat (about once a second): its model's
  queue depth per tier, and the worker's KV-cache use, tokens/s and running
  requests, each stored whole under one field (the bucket keeps the last).

A bucket is one Redis hash (`<QUEUE_KEY_PREFIX>:timeline:<bucket>`, expiring
after an hour) written with one pipelined round trip, so every web process
reads the same figures; with no REDIS_URL (the embedded mode: the worker is a
thread of the web process) the buckets are a ring in this process's memory.
Writing never fails a request or a heartbeat: a Redis error drops the figure,
an outage is logged once (common.outage), and while it lasts the writers try
once per RETRY_S instead of waiting out a socket timeout at every step. The durable record stays the
usage ledger; Prometheus (`/metrics`) exports the same figures for Grafana.
"""

from __future__ import annotations

import bisect
import json
import logging
import math
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from django.conf import settings

from common.figures_redis import figures_forget, figures_redis
from common.outage import Outage

logger = logging.getLogger(__name__)

BUCKET_S = 10
KEEP_S = 3600
# upper bounds of the TTFT histogram's bins (seconds): 1 ms * 2**(i/4), up to about 65 s; above: the last bin
TTFT_BOUNDS = tuple(0.001 * 2 ** (i / 4) for i in range(65))
REQUESTS = "requests"
WORKER_ERRORS = "worker_errors"
TTFT = "ttft:"  # + bin index
DEPTH = "depth:"  # + model -> JSON {tier: depth} (tiers with nothing queued left out)
WORKER = "worker:"  # + worker id -> JSON {"model", "kv_usage", "tok_s", "running"}

_lock = threading.Lock()
_memory: dict[int, dict[str, Any]] = {}
_outage = Outage(logger, "console timeline (Redis)")
RETRY_S = 5.0  # while Redis is away, figures are dropped without trying for this long after a failure
_retry_at = 0.0


def bucket_of(instant: float) -> int:
    """The bucket holding `instant` (seconds since the epoch), as its start."""
    return int(instant // BUCKET_S) * BUCKET_S


def ttft_bin(seconds: float) -> int:
    return min(bisect.bisect_left(TTFT_BOUNDS, max(0.0, seconds)), len(TTFT_BOUNDS) - 1)


def _key(bucket: int) -> str:
    return f"{settings.QUEUE_KEY_PREFIX}:timeline:{bucket}"


def _write(bucket: int, *, add: Mapping[str, int] = {}, put: Mapping[str, str] = {}) -> None:
    """Add to the bucket's counters, replace its snapshot fields. Never raises."""
    if not add and not put:
        return
    if not settings.REDIS_URL:
        with _lock:
            fields = _memory.setdefault(bucket, {})
            for name, count in add.items():
                fields[name] = int(fields.get(name, 0)) + count
            fields.update(put)
            for stale in [b for b in _memory if b <= bucket - KEEP_S]:
                del _memory[stale]
        return
    global _retry_at
    if _outage.down and time.monotonic() < _retry_at:
        return  # Redis is away: the finisher's thread does not wait on a timeout per step (one try per RETRY_S)
    try:
        pipe = figures_redis().pipeline(transaction=False)
        for name, count in add.items():
            pipe.hincrby(_key(bucket), name, count)
        if put:
            pipe.hset(_key(bucket), mapping=dict(put))
        pipe.expire(_key(bucket), KEEP_S + 2 * BUCKET_S)
        pipe.execute()
    except Exception as exc:  # noqa: BLE001 - a chart's point is never worth a failed request or heartbeat
        _retry_at = time.monotonic() + RETRY_S
        _outage.failed(f"timeline figures dropped: {exc}")
    else:
        _outage.ok()


def requests_add(records: Iterable[Mapping], *, now: float | None = None) -> None:
    """Count finished requests (usage-record fields) in the current bucket: one write for the batch."""
    add: dict[str, int] = {}
    try:
        for record in records:
            add[REQUESTS] = add.get(REQUESTS, 0) + 1
            if record.get("finish_reason") == "error":
                add[WORKER_ERRORS] = add.get(WORKER_ERRORS, 0) + 1
            ttft = record.get("ttft_s")
            if ttft is not None:
                name = f"{TTFT}{ttft_bin(float(ttft))}"
                add[name] = add.get(name, 0) + 1
    except Exception:  # noqa: BLE001
        logger.exception("timeline: request figures failed")
        return
    _write(bucket_of(now if now is not None else time.time()), add=add)


def worker_sample(*, queue, worker_id: str, model: str, engine_stats: Mapping | None, tok_s: float,
                  now: float | None = None) -> None:
    """A heartbeat's figures: the model's queue depth per tier (read from `queue`) and this worker's load."""
    try:
        depths = {str(tier): int(count) for tier, count in queue.depths(model).items() if int(count) > 0}
    except Exception as exc:  # noqa: BLE001 - the worker's own figures are still worth a point
        logger.debug("timeline: queue depths unreadable: %s", exc)
        depths = None
    stats = engine_stats or {}
    load = {"model": model, "kv_usage": round(float(stats.get("kv_usage") or 0.0), 4),
            "tok_s": round(float(tok_s or 0.0), 2), "running": int(stats.get("running") or 0)}
    put = {f"{WORKER}{worker_id}": json.dumps(load)}
    if depths is not None:
        put[f"{DEPTH}{model}"] = json.dumps(depths)
    _write(bucket_of(now if now is not None else time.time()), put=put)


def buckets_read(*, first: int, last: int) -> dict[int, dict[str, Any]]:
    """bucket start -> its fields (counters as ints, snapshots decoded), for the buckets first..last that hold
    anything. Empty on a Redis error (logged)."""
    starts = list(range(bucket_of(first), bucket_of(last) + 1, BUCKET_S))
    if not settings.REDIS_URL:
        with _lock:
            raw = {bucket: dict(_memory[bucket]) for bucket in starts if bucket in _memory}
    else:
        try:
            pipe = figures_redis().pipeline(transaction=False)
            for bucket in starts:
                pipe.hgetall(_key(bucket))
            raw = {bucket: {name.decode(): value.decode() for name, value in fields.items()}
                   for bucket, fields in zip(starts, pipe.execute()) if fields}
        except Exception as exc:  # noqa: BLE001
            logger.warning("console timeline unreadable: %s", exc)
            return {}
    return {bucket: _decoded(fields) for bucket, fields in raw.items()}


def _decoded(fields: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in fields.items():
        if name.startswith((DEPTH, WORKER)):
            try:
                out[name] = json.loads(value)
            except (TypeError, ValueError):
                continue
        else:
            out[name] = int(value)
    return out


def ttft_quantile(counts: Mapping[int, int], q: float) -> float | None:
    """The q-quantile of a TTFT histogram (bin index -> count), interpolated inside its bin (geometrically; the
    first bin linearly from 0), as Prometheus' histogram_quantile; None when it holds nothing."""
    total = sum(counts.values())
    if total <= 0:
        return None
    rank = q * total
    seen = 0
    for index in sorted(counts):
        count = counts[index]
        if count <= 0:
            continue
        if seen + count >= rank:
            upper = TTFT_BOUNDS[index]
            within = (rank - seen) / count
            if index == 0:
                return upper * within
            lower = TTFT_BOUNDS[index - 1]
            return lower * math.exp(math.log(upper / lower) * within)
        seen += count
    return TTFT_BOUNDS[max(counts)]


def timeline_clear() -> None:
    """Tests: forget the buckets (of this process, or under this prefix in Redis)."""
    with _lock:
        _memory.clear()
    figures_forget("timeline")
