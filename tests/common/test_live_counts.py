"""Live counts (common.live_counts) while Redis is away: every request still answers, and the outage is logged
once, not once per dropped event (a Redis restart under load logged a line per refused request)."""

from __future__ import annotations

import logging

import pytest

from common import live_counts
from common.outage import Outage


@pytest.fixture
def counts_on(settings):
    """live_counts pointed at `url` (common.figures_redis makes a client for a changed URL), with a fresh
    outage state; restored after."""
    saved = live_counts._outage

    def point(url: str) -> None:
        settings.REDIS_URL = url

    live_counts._outage = Outage(live_counts.logger, "live counts (Redis)")
    yield point
    live_counts._outage = saved


def test_an_outage_is_logged_once_and_its_end_once(counts_on, caplog):
    from tests.billing.admission_helpers import REDIS_TEST_URL, require_redis

    require_redis()
    caplog.set_level(logging.WARNING, logger="common.live_counts")
    counts_on("redis://127.0.0.1:1/0")  # nothing listens there
    for code in ("limits_unavailable", "queue_unavailable", "limits_unavailable"):
        live_counts.count_event(live_counts.ERRORS, code)  # never raises
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["live counts (Redis) unavailable"]
    counts_on(REDIS_TEST_URL)
    live_counts.count_event(live_counts.ERRORS, "after")
    assert caplog.records[-1].getMessage().startswith("live counts (Redis) back after")
    assert live_counts.event_counts(live_counts.ERRORS, window_s=60).get("after", 0) >= 1
