"""Admission policy against the database: which limits apply, quotas and budgets over the tenant's month,
rebuilds from the ledger, settlement by the worker's record path, alerts, the stale sweep (injected clock)."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone

import pytest
from asgiref.sync import async_to_sync
from django.core import mail

from billing.counters import reset_admission_backend
from billing.counters.base import QUOTA, SPEND
from billing.counters.keys import CounterKey
from billing.counters.memory import MemoryAdmission
from billing.services.admission_plan import period_current
from billing.services.admission_reserve import aadmission_reserve
from billing.services.admission_settle import admission_settle_records
from common.errors import InsufficientQuota, RateLimited
from tenants.services.limits import LimitScope
from tests.billing.admission_helpers import Clock

MODEL = "m"


@pytest.fixture
def clock():
    clock = Clock(datetime.now(timezone.utc).timestamp())
    reset_admission_backend(MemoryAdmission(clock=clock))
    return clock


@pytest.fixture
def auth_for(db):
    from tenants.services.api_keys import AuthContext

    def make(tenant, api_key=None):
        return AuthContext(tenant=tenant, tier=tenant.tier, api_key=api_key)

    return make


def reserve(auth, *, prompt: int = 10, max_tokens: int = 10, request_id: str | None = None):
    return async_to_sync(aadmission_reserve)(auth=auth, request_id=request_id or uuid.uuid4().hex, model=MODEL,
                                            prompt_tokens=prompt, max_tokens=max_tokens)


def finished(admission, auth, *, prompt: int, completion: int, cached: int = 0, reason: str = "stop") -> dict:
    return {"request_id": admission.request_id, "tenant_id": auth.tenant.pk, "model": MODEL,
            "tier": auth.tier.name, "prompt_tokens": prompt, "cached_tokens": cached,
            "completion_tokens": completion, "finish_reason": reason, "admitted_at": None}


def _month() -> str:
    return period_current(tz="UTC").label


def unlimited_tier(tier_factory, **fields):
    base = {"requests_per_minute": 0, "tokens_per_minute": 0, "max_concurrent_requests": 0, "monthly_token_quota": 0}
    return tier_factory(**{**base, **fields})


def test_tier_defaults_tenant_overrides_and_a_key_ceiling(clock, tenant_factory, tier_factory, api_key_factory,
                                                           auth_for):
    tenant = tenant_factory(tier=unlimited_tier(tier_factory, requests_per_minute=5), requests_per_minute=3)
    key = api_key_factory(tenant=tenant).api_key
    capped = api_key_factory(tenant=tenant, name="app").api_key
    capped.requests_per_minute = 1
    first = reserve(auth_for(tenant, key))
    assert first.headers["x-ratelimit-limit-requests"] == "3"  # the tenant's override beats the tier's 5
    assert first.headers["x-ratelimit-remaining-requests"] == "2"
    assert reserve(auth_for(tenant, capped)).headers["x-ratelimit-limit-requests"] == "1"  # the key binds first
    with pytest.raises(RateLimited) as refused:
        reserve(auth_for(tenant, capped))
    assert f"API key {capped.redacted}" in refused.value.message
    assert reserve(auth_for(tenant, key)).reserved  # the tenant still has one left for its other keys


def test_tokens_per_minute_take_prompt_plus_max_tokens_and_settle_refunds_the_rest(clock, tenant_factory,
                                                                                  tier_factory, auth_for):
    auth = auth_for(tenant_factory(tier=unlimited_tier(tier_factory, tokens_per_minute=1000)))
    admission = reserve(auth, prompt=100, max_tokens=500)
    assert admission.headers["x-ratelimit-remaining-tokens"] == "400"
    assert admission.headers["x-ratelimit-reset-tokens"] == "36s"
    with pytest.raises(RateLimited) as refused:
        reserve(auth, prompt=100, max_tokens=400)
    assert refused.value.code == "rate_limit_exceeded" and refused.value.status_code == 429
    assert "tokens per min (TPM): Limit 1000, Used 600, Requested 500. Please try again in 6s." in refused.value.message
    assert refused.value.headers["Retry-After"] == "6" and refused.value.headers["retry-after-ms"] == "6000"
    # 100 prompt tokens, 80 of them from the prefix cache, 20 generated: 40 count, 560 come back
    admission_settle_records([finished(admission, auth, prompt=100, cached=80, completion=20)])
    assert reserve(auth, prompt=100, max_tokens=400).headers["x-ratelimit-remaining-tokens"] == "460"


def test_monthly_token_quota_counts_the_tenants_month_and_names_its_end(clock, tenant_factory, tier_factory,
                                                                        auth_for, record_write):
    tenant = tenant_factory(tier=unlimited_tier(tier_factory, monthly_token_quota=5_000), timezone="America/Los_Angeles")
    period = period_current(tz="America/Los_Angeles")
    record_write(tenant, prompt_tokens=3_000, completion_tokens=1_000)  # in the ledger (this month)
    auth = auth_for(tenant)
    assert reserve(auth, prompt=400, max_tokens=500).reserved
    with pytest.raises(InsufficientQuota) as refused:
        reserve(auth, prompt=50, max_tokens=60)
    error = refused.value
    assert (error.status_code, error.code, error.error_type) == (429, "insufficient_quota", "insufficient_quota")
    assert "monthly token quota" in error.message and "Limit 5000, Used 4900, Requested 110" in error.message
    import zoneinfo

    assert period.end.astimezone(zoneinfo.ZoneInfo("America/Los_Angeles")).isoformat() in error.message
    assert int(error.headers["Retry-After"]) > 0


def test_a_budget_reserves_the_worst_case_and_settles_to_the_cost(clock, tenant_factory, tier_factory, auth_for,
                                                                  price_factory):
    from billing.counters import get_admission_backend

    price_factory(model=MODEL, input="1", cached="0.5", output="2", effective_from=datetime(2020, 1, 1, tzinfo=timezone.utc))
    # 1000 prompt tokens at $1/M + 1000 output at $2/M = $0.003 worst case; budget $0.005
    tenant = tenant_factory(tier=unlimited_tier(tier_factory), monthly_spend_limit_micros=5_000)
    auth = auth_for(tenant)
    first = reserve(auth, prompt=1000, max_tokens=1000)
    with pytest.raises(InsufficientQuota) as refused:
        reserve(auth, prompt=1000, max_tokens=1000)
    assert "monthly budget" in refused.value.message
    assert "Limit $0.005, Used $0.003, Requested up to $0.003" in refused.value.message
    # it used 1000 prompt tokens (500 cached) and 100 output: $0.00075 + $0.0002
    admission_settle_records([finished(first, auth, prompt=1000, cached=500, completion=100)])
    key = get_admission_backend().key(CounterKey.period_total(LimitScope.tenant(tenant.pk), _month(), SPEND))
    assert get_admission_backend().counter_get(key) == 950_000  # nano-dollars
    assert reserve(auth, prompt=1000, max_tokens=1000).reserved


def test_the_workers_overlapped_settlement_settles_as_the_direct_one_does(clock, tenant_factory, tier_factory,
                                                                          auth_for, price_factory):
    """admission_settle_start (the worker: the counters' call started before its insert, finished after)
    leaves the counters where admission_settle_records does."""
    from billing.counters import get_admission_backend
    from billing.services.admission_settle import admission_settle_start

    price_factory(model=MODEL, input="1", cached="0.5", output="2", effective_from=datetime(2020, 1, 1, tzinfo=timezone.utc))
    tenant = tenant_factory(tier=unlimited_tier(tier_factory, max_concurrent_requests=1),
                            monthly_spend_limit_micros=5_000)
    auth = auth_for(tenant)
    backend = get_admission_backend()
    started = []
    settle_many_start = backend.settle_many_start
    backend.settle_many_start = lambda items: started.append(len(items)) or settle_many_start(items)
    first = reserve(auth, prompt=1000, max_tokens=1000)
    wait = admission_settle_start([finished(first, auth, prompt=1000, cached=500, completion=100)])
    assert started == [1] and wait() is True
    key = backend.key(CounterKey.period_total(LimitScope.tenant(tenant.pk), _month(), SPEND))
    assert backend.counter_get(key) == 950_000  # as in the direct settlement above
    second = reserve(auth, prompt=1000, max_tokens=1000)  # the one concurrency slot is free again
    assert admission_settle_start([finished(second, auth, prompt=1000, completion=1000)], overlap=False)() is True
    assert started == [1]  # not overlapped: settle_many
    assert backend.counter_get(key) == 950_000 + 3_000_000


def test_a_flushed_counter_is_rebuilt_from_the_ledger(clock, tenant_factory, tier_factory, auth_for, record_write):
    from billing.counters import get_admission_backend

    tenant = tenant_factory(tier=unlimited_tier(tier_factory, monthly_token_quota=10_000))
    auth = auth_for(tenant)
    admission = reserve(auth, prompt=1_000, max_tokens=1_000)
    record_write(tenant, request_id=admission.request_id, prompt_tokens=1_000, completion_tokens=500)
    admission_settle_records([finished(admission, auth, prompt=1_000, completion=500)])
    get_admission_backend().flush()  # Redis restarted: the month's usage must still count
    assert reserve(auth, prompt=4_000, max_tokens=4_000).reserved  # 1,500 + 8,000
    with pytest.raises(InsufficientQuota) as refused:
        reserve(auth, prompt=400, max_tokens=200)
    assert "Used 9500" in refused.value.message


def test_keys_made_by_a_limited_key_share_its_quota_also_after_a_rebuild(clock, tenant_factory, tier_factory,
                                                                         api_key_factory, auth_for, record_write):
    """A limited key's keys count on its counters too (tenants.services.limits.key_scopes), and a counter rebuilt
    from the ledger (Redis restarted) counts the records of the keys it made (billing's `_key_family`)."""
    from billing.counters import get_admission_backend
    from tenants.services.api_keys import api_key_create_for
    from tenants.services.limits import limits_set

    tenant = tenant_factory(tier=unlimited_tier(tier_factory))
    parent = api_key_factory(tenant=tenant).api_key
    limits_set(tenant=tenant, api_key=parent, values={"monthly_token_quota": 10_000})
    parent.refresh_from_db()
    child = api_key_create_for(creator=parent, name="child").api_key
    grandchild = api_key_create_for(creator=child, name="grandchild").api_key
    for key, tokens in ((child, 3_000), (grandchild, 3_000)):
        auth = auth_for(tenant, key)
        admission = reserve(auth, prompt=tokens, max_tokens=0)
        record_write(tenant, key, request_id=admission.request_id, prompt_tokens=tokens, completion_tokens=0)
        admission_settle_records([{**finished(admission, auth, prompt=tokens, completion=0), "api_key_id": key.pk}])
    with pytest.raises(InsufficientQuota):  # 6,000 used by its keys: 5,000 more does not fit the parent's 10,000
        reserve(auth_for(tenant, parent), prompt=5_000, max_tokens=0)
    get_admission_backend().flush()  # the counters are rebuilt from the ledger: the keys' records still count
    with pytest.raises(InsufficientQuota):
        reserve(auth_for(tenant, parent), prompt=5_000, max_tokens=0)
    assert reserve(auth_for(tenant, parent), prompt=4_000, max_tokens=0).reserved


def test_budget_alerts_go_to_the_owners_once_per_threshold(clock, tenant_factory, tier_factory, auth_for,
                                                           price_factory, django_user_model, settings):
    from tenants.models import Membership

    settings.CELERY_TASK_ALWAYS_EAGER = True
    price_factory(model=MODEL, input="1", cached="1", output="1", effective_from=datetime(2020, 1, 1, tzinfo=timezone.utc))
    tenant = tenant_factory(tier=unlimited_tier(tier_factory), monthly_spend_limit_micros=100)  # $0.0001: 100 tokens
    owner = django_user_model.objects.create_user("owner", email="owner@example.com")
    member = django_user_model.objects.create_user("member", email="member@example.com")
    Membership.objects.create(user=owner, tenant=tenant, role=Membership.Role.OWNER)
    Membership.objects.create(user=member, tenant=tenant, role=Membership.Role.MEMBER)
    auth = auth_for(tenant)
    for used in (30, 25, 10, 20, 15):  # 30, 55, 65, 85, 100 %
        admission = reserve(auth, prompt=used, max_tokens=0)
        admission_settle_records([finished(admission, auth, prompt=used, completion=0)])
    subjects = [message.subject for message in mail.outbox]
    assert len(subjects) == 3 and all(m.to == ["owner@example.com"] for m in mail.outbox)
    assert [s.split(" has used ")[1].split("%")[0] for s in subjects] == ["50", "80", "100"]


def test_budget_alerts_use_the_tenants_own_thresholds(clock, tenant_factory, tier_factory, auth_for, price_factory,
                                                      django_user_model, settings):
    from billing.selectors import alert_percents_forget
    from tenants.models import Membership
    from billing.services.budgets import budget_alert_percents_set

    settings.CELERY_TASK_ALWAYS_EAGER = True
    price_factory(model=MODEL, input="1", cached="1", output="1", effective_from=datetime(2020, 1, 1, tzinfo=timezone.utc))
    tenant = tenant_factory(tier=unlimited_tier(tier_factory), monthly_spend_limit_micros=100)  # $0.0001: 100 tokens
    owner = django_user_model.objects.create_user("owner", email="owner@example.com")
    Membership.objects.create(user=owner, tenant=tenant, role=Membership.Role.OWNER)
    budget_alert_percents_set(tenant=tenant, percents=[20, 60])  # instead of the platform's 50, 80, 100
    alert_percents_forget()
    auth = auth_for(tenant)
    for used in (30, 25, 10, 20, 15):  # 30, 55, 65, 85, 100 %
        admission = reserve(auth, prompt=used, max_tokens=0)
        admission_settle_records([finished(admission, auth, prompt=used, completion=0)])
    alert_percents_forget()
    assert [m.subject.split(" has used ")[1].split("%")[0] for m in mail.outbox] == ["20", "60"]


def test_the_stale_sweep_settles_lost_reservations(clock, tenant_factory, tier_factory, auth_for, record_write,
                                                   settings):
    from billing.services.admission_settle import reservations_release_stale

    settings.ADMISSION_HOLD_S = 100
    tenant = tenant_factory(tier=unlimited_tier(tier_factory, max_concurrent_requests=2, monthly_token_quota=10_000))
    auth = auth_for(tenant)
    ended, lost = reserve(auth, prompt=100, max_tokens=900), reserve(auth, prompt=100, max_tokens=900)
    assert ended.reserved and lost.reserved
    with pytest.raises(RateLimited) as refused:
        reserve(auth)
    assert "concurrent requests: Limit 2, Used 2, Requested 1." in refused.value.message
    record_write(tenant, request_id=ended.request_id, prompt_tokens=100, completion_tokens=50)
    assert reservations_release_stale() == 0
    clock.now += 101
    assert reservations_release_stale() == 2
    from billing.counters import get_admission_backend

    key = get_admission_backend().key(CounterKey.period_total(LimitScope.tenant(tenant.pk), _month(), QUOTA))
    assert get_admission_backend().counter_get(key) == 150  # the ended request's record; the lost one freed
    assert reserve(auth).reserved and reserve(auth).reserved


def test_a_reaped_request_releases_its_slot(clock, tenant_factory, tier_factory, auth_for):
    from inference.queue import ReapResult
    from inference.worker.reaper import reap_result_finish
    from tests.inference.queue_helpers import make_job

    tenant = tenant_factory(tier=unlimited_tier(tier_factory, max_concurrent_requests=1))
    auth = auth_for(tenant)
    admission = reserve(auth)
    with pytest.raises(RateLimited):
        reserve(auth)

    class Sink:
        def send(self, channel, event):
            self.event = event

    job = make_job(tier=tenant.tier.name, tenant_id=tenant.pk, request_id=admission.request_id,
                   reservation_id=admission.request_id)
    reap_result_finish(result=ReapResult(dead_workers=["w"], failed=[("w", job)]), sink=Sink())
    assert reserve(auth).reserved
