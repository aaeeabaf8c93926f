"""The operator console: staff only; workers and queue depths from the queue, revenue from the ledger."""

from __future__ import annotations

from datetime import datetime, timedelta
from datetime import timezone as dt_timezone

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from billing.models import UsageRecord
from billing.money import usd_str
from billing.services.rollups import hourly_usage_fill
from common.live_counts import ERRORS, REFUSALS, count_event, event_counts, live_counts_clear
from dashboard.selectors.console import console_summary, spend_by_tenant
from common.errors import InsufficientQuota, RateLimited
from inference.queue import get_job_queue
from inference.queue.job import Job
from tests.billing.test_admission_service import auth_for, clock, reserve, unlimited_tier  # noqa: F401 (fixtures)

UTC = dt_timezone.utc


@pytest.fixture
def fresh_queue(settings):
    """The process's queue and live counts under a prefix of this test's own (Redis or in-process)."""
    import uuid

    from inference.queue import reset_job_queue

    settings.QUEUE_KEY_PREFIX = f"dash-test-{uuid.uuid4().hex[:8]}"
    reset_job_queue()
    live_counts_clear()
    queue = get_job_queue()
    yield queue
    queue.flush()
    live_counts_clear()
    reset_job_queue()


@pytest.fixture
def staff_client(db):
    client = Client()
    client.force_login(get_user_model().objects.create_user("ops", password="x-long-password-1", is_staff=True))
    return client


def test_console_is_staff_only(tenant, member_factory, staff_client):
    member = Client()
    member.force_login(member_factory(tenant, "owner"))
    for url in ("/admin/console/", "/admin/console/summary.json"):
        response = member.get(url)
        assert response.status_code == 302 and "/admin/login/" in response.url
        assert staff_client.get(url).status_code == 200
    assert b"Operator console" in staff_client.get("/admin/").content


def test_revenue_equals_the_ledger_across_rollup_states(tenant_factory, seed_usage):
    a, b = tenant_factory(), tenant_factory()
    now = datetime(2026, 4, 10, 15, 20, tzinfo=UTC)
    seed_usage(a, start=datetime(2026, 3, 30, tzinfo=UTC), hours=11 * 24 + 15, per_hour=1)
    seed_usage(b, start=datetime(2026, 4, 2, tzinfo=UTC), hours=8 * 24, per_hour=2, seed=5)
    month = datetime(2026, 4, 1, tzinfo=UTC)
    for filled in (None, datetime(2026, 4, 5, 7, tzinfo=UTC), datetime(2026, 4, 10, 15, tzinfo=UTC)):
        if filled:
            hourly_usage_fill(now=filled)
        expected = {}
        for record in UsageRecord.objects.filter(created_at__gte=month, created_at__lt=now):
            expected[record.tenant_id] = expected.get(record.tenant_id, 0) + record.cost_femtos
        assert spend_by_tenant(start=month, end=now) == expected


def test_summary_shows_workers_queues_and_counts(tenant, served_model, fresh_queue):
    queue = fresh_queue
    queue.heartbeat("w-test", served_model.name, {"device": "cpu", "status": "serving", "running": 2, "waiting": 1,
                                                   "kv_usage": 0.25, "tok_s": 31.5})
    queue.enqueue(Job(request_id="r-console", tenant_id=tenant.pk, api_key_id=None, tier=tenant.tier.name,
                      priority=1, model=served_model.name, prompt_token_ids=[1, 2], sampling={}, reply_channel="x"))
    count_event(ERRORS, "429 rate_limit_exceeded")
    count_event(REFUSALS, "requests")
    summary = console_summary()
    assert [w["worker_id"] for w in summary["workers"]] == ["w-test"]
    assert summary["workers"][0]["running"] == 2 and summary["workers"][0]["kv_usage"] == 0.25
    depth = {(q["model"], q["tier"]): q["depth"] for q in summary["queues"]}
    assert depth[(served_model.name, tenant.tier.name)] == 1
    assert summary["errors_by_code"] == {"429 rate_limit_exceeded": 1}
    assert summary["refusals_by_kind"] == {"requests": 1}
    assert summary["revenue_month_usd"] == usd_str(0)


def test_api_errors_are_counted(api_client, db, fresh_queue):
    api_client.get("/v1/models", HTTP_AUTHORIZATION="Bearer sk-nope")
    assert event_counts(ERRORS) == {"401 invalid_api_key": 1}


def test_admission_refusals_are_counted_by_kind(clock, tenant_factory, tier_factory, auth_for, fresh_queue):
    tenant = tenant_factory(tier=unlimited_tier(tier_factory, requests_per_minute=1, monthly_token_quota=25))
    auth = auth_for(tenant)
    reserve(auth, prompt=10, max_tokens=10)
    with pytest.raises(RateLimited):
        reserve(auth, prompt=1, max_tokens=1)  # within the quota: the rate refuses
    clock.now += 60
    with pytest.raises(InsufficientQuota):
        reserve(auth, prompt=10, max_tokens=10)
    assert event_counts(REFUSALS) == {"quota": 1, "requests": 1}
