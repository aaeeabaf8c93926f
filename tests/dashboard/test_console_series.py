"""The console's last hour (inference.metrics.timeline -> dashboard.selectors.console_series -> series.json):
the same points from the in-process ring (embedded mode) and from Redis, percentiles from the TTFT histogram
within one bin of the exact ones, gaps where no worker beat, and the endpoint staff-only and strict on `since`."""

from __future__ import annotations

import random
import uuid

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from billing.services.latency_rollups import percentile_cont
from common import live_counts
from dashboard.selectors.console_series import WORKER_ERROR_LABEL, console_series
from inference.metrics import timeline
from inference.queue.memory import MemoryJobQueue
from inference.queue.redis_backend import RedisJobQueue
from tests.inference.queue_helpers import REDIS_TEST_URL, make_job, require_redis

T0 = 1_900_000_020.0  # a bucket start (a multiple of 60 s), far from the wall clock's buckets


@pytest.fixture(params=["memory", "redis"])
def store(request, settings):
    """The timeline, live counts and a real job queue on the parametrized backend, under a prefix of their own."""
    settings.QUEUE_KEY_PREFIX = f"series-test-{uuid.uuid4().hex[:8]}"
    if request.param == "redis":
        require_redis()
        settings.REDIS_URL = REDIS_TEST_URL
        queue = RedisJobQueue(url=REDIS_TEST_URL, prefix=settings.QUEUE_KEY_PREFIX)
    else:
        settings.REDIS_URL = ""
        queue = MemoryJobQueue()
    timeline.timeline_clear()  # (common.figures_redis makes a client for the URL set here)
    live_counts.live_counts_clear()
    yield queue
    timeline.timeline_clear()
    live_counts.live_counts_clear()
    queue.flush()


def record(ttft: float | None = 0.2, finish_reason: str = "stop") -> dict:
    return {"request_id": uuid.uuid4().hex, "ttft_s": ttft, "finish_reason": finish_reason}


def test_points_from_endings_and_heartbeats(store):
    queue = store
    stats = {"kv_usage": 0.25, "running": 1}
    # an idle worker beats: nothing queued
    timeline.worker_sample(queue=queue, worker_id="w1", model="m", engine_stats=stats, tok_s=0, now=T0 + 1)
    # then three jobs wait in two tiers, and two requests end (one an engine error)
    for tier in ("pro", "pro", "free"):
        queue.enqueue(make_job(model="m", tier=tier))
    timeline.worker_sample(queue=queue, worker_id="w1", model="m", engine_stats=stats, tok_s=42.5, now=T0 + 12)
    timeline.requests_add([record(0.1), record(None, "error")], now=T0 + 13)
    # no beat at all in the third bucket; the fourth: the queue is empty again
    assert len(queue.lease("w1", "m", 10)) == 3
    timeline.worker_sample(queue=queue, worker_id="w1", model="m", engine_stats={"kv_usage": 0.0}, tok_s=3,
                           now=T0 + 31)
    series = console_series(now=T0 + 35)
    points = {p["t"]: p for p in series["points"]}
    assert series["bucket_s"] == 10 and len(series["points"]) == 360 and series["points"][-1]["t"] == T0 + 30
    first, busy, silent, drained = (points[T0 + s] for s in (0, 10, 20, 30))
    assert first["queue_depth"] == {"free": 0, "pro": 0} and busy["queue_depth"] == {"free": 1, "pro": 2}
    assert silent["queue_depth"] is None and silent["workers"] == {}  # no heartbeat: a gap, not a zero
    assert drained["queue_depth"] == {"free": 0, "pro": 0}
    assert busy["workers"] == {"w1": {"model": "m", "kv_usage": 0.25, "tok_s": 42.5, "running": 1}}
    assert busy["requests_per_s"] == 0.2 and first["requests_per_s"] == 0 and silent["requests_per_s"] == 0
    assert busy["ttft_p50_s"] == pytest.approx(0.1, rel=0.19) and first["ttft_p50_s"] is None
    assert silent["ttft_p50_s"] == busy["ttft_p50_s"]  # the minute up to the point
    minute = next(e for e in series["events"] if e["t"] == T0)
    assert minute["errors"] == {WORKER_ERROR_LABEL: 1}
    # the page's poll: only the points from `since` on
    later = console_series(since=T0 + 15, now=T0 + 35)
    assert [p["t"] for p in later["points"]] == [T0 + 10, T0 + 20, T0 + 30]
    assert later["points"] == series["points"][-3:]


def test_the_current_bucket_is_a_rate_so_far(store):
    timeline.requests_add([record() for _ in range(6)], now=T0 + 1)
    assert console_series(now=T0 + 3)["points"][-1]["requests_per_s"] == 2.0
    assert console_series(now=T0 + 10)["points"][-2]["requests_per_s"] == 0.6


def test_api_errors_and_refusals_per_minute(store):
    live_counts.count_event(live_counts.ERRORS, "429 rate_limit_exceeded", now=T0 + 61)
    live_counts.count_event(live_counts.ERRORS, "429 rate_limit_exceeded", now=T0 + 62)
    live_counts.count_event(live_counts.REFUSALS, "quota", now=T0 + 125)
    events = {e["t"]: e for e in console_series(now=T0 + 130)["events"]}
    assert events[T0 + 60] == {"t": T0 + 60, "errors": {"429 rate_limit_exceeded": 2}, "refusals": {}}
    assert events[T0 + 120]["refusals"] == {"quota": 1} and events[T0]["errors"] == {}


def test_an_hour_is_kept(store):
    timeline.requests_add([record()], now=T0)
    assert console_series(now=T0 + 3599)["points"][0]["requests_per_s"] == 0.1
    assert all(p["requests_per_s"] == 0 for p in console_series(now=T0 + 3610)["points"])


def test_ttft_percentiles_within_one_bin_of_the_exact_ones():
    rng = random.Random(7)
    samples = [rng.lognormvariate(-1.5, 1.0) for _ in range(2000)]
    counts: dict[int, int] = {}
    for value in samples:
        counts[timeline.ttft_bin(value)] = counts.get(timeline.ttft_bin(value), 0) + 1
    for q in (0.5, 0.95, 0.99):
        exact = percentile_cont(sorted(samples), q)
        assert timeline.ttft_quantile(counts, q) == pytest.approx(exact, rel=0.19)
    assert timeline.ttft_quantile({}, 0.5) is None
    assert timeline.ttft_bin(0) == 0 and timeline.ttft_bin(10**6) == len(timeline.TTFT_BOUNDS) - 1


def test_a_redis_outage_drops_points_and_fails_nothing(settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    try:
        timeline.requests_add([record()])
        timeline.worker_sample(queue=MemoryJobQueue(), worker_id="w", model="m", engine_stats=None, tok_s=0)
        series = console_series()
        assert all(p["requests_per_s"] == 0 and p["queue_depth"] is None for p in series["points"])
        assert all(not e["errors"] and not e["refusals"] for e in series["events"])
        tries = []
        real = timeline.figures_redis
        timeline.figures_redis = lambda: tries.append(1) or real()
        for _ in range(20):  # a finisher's steps while Redis is away: one try per RETRY_S, not a timeout each
            timeline.requests_add([record()])
        assert tries == []
    finally:
        if "real" in locals():
            timeline.figures_redis = real
        timeline._retry_at = 0.0
        timeline._outage.ok()


@pytest.fixture
def staff_client(db):
    client = Client()
    client.force_login(get_user_model().objects.create_user("ops-series", password="x-long-password-1",
                                                            is_staff=True))
    return client


def test_series_json_is_staff_only_and_strict_about_since(store, tenant, member_factory, staff_client):
    member = Client()
    member.force_login(member_factory(tenant, "owner"))
    response = member.get("/admin/console/series.json")
    assert response.status_code == 302 and "/admin/login/" in response.url
    response = staff_client.get("/admin/console/series.json")
    assert response.status_code == 200 and "no-store" in response["Cache-Control"]
    assert len(response.json()["points"]) == 360
    import time

    recent = staff_client.get(f"/admin/console/series.json?since={time.time() - 25}").json()
    assert 3 <= len(recent["points"]) <= 4
    for bad in ("nan", "inf", "yesterday", "1e999"):
        response = staff_client.get(f"/admin/console/series.json?since={bad}")
        assert response.status_code == 400 and response.json()["error"]["param"] == "since", bad


def test_console_page_has_the_charts(staff_client):
    html = staff_client.get("/admin/console/").content.decode()
    assert 'id="console-charts"' in html and 'data-series-url="/admin/console/series.json"' in html
    for chart in ("chart-rps", "chart-ttft", "chart-queue", "chart-events", "chart-kv", "chart-tok-s"):
        assert f'id="{chart}"' in html
    assert html.index('id="console-charts"') < html.index('id="workers"')  # the tables beneath
