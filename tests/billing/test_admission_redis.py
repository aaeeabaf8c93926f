"""The service on the Redis backend: a FLUSHDB mid-month forgets no spend (rebuilt from the ledger),
and an unreachable Redis admits nothing."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone

import pytest
from asgiref.sync import async_to_sync

from billing.counters import reset_admission_backend
from billing.counters.redis_backend import RedisAdmission
from billing.services.admission_reserve import aadmission_reserve
from billing.services.admission_settle import admission_settle_records
from common.errors import InsufficientQuota, ServiceUnavailable
from tests.billing.admission_helpers import REDIS_TEST_URL, require_redis

MODEL = "m"


@pytest.fixture
def redis_backend():
    require_redis()
    backend = RedisAdmission(url=REDIS_TEST_URL, prefix=f"test:{uuid.uuid4().hex}")
    reset_admission_backend(backend)
    yield backend
    backend.flush()


def reserve(auth, **sizes):
    return async_to_sync(aadmission_reserve)(auth=auth, request_id=uuid.uuid4().hex, model=MODEL, **sizes)


def test_a_flushed_redis_still_counts_the_months_spend(redis_backend, tenant_factory, tier_factory, price_factory,
                                                       record_write):
    from tenants.services.api_keys import AuthContext

    price_factory(model=MODEL, input="1", cached="1", output="1", effective_from=datetime(2020, 1, 1, tzinfo=timezone.utc))
    tier = tier_factory(requests_per_minute=100, tokens_per_minute=0, max_concurrent_requests=5, monthly_token_quota=0)
    tenant = tenant_factory(tier=tier, monthly_spend_limit_micros=3_000)  # $0.003 = 3,000 tokens at $1/M
    auth = AuthContext(tenant=tenant, tier=tier, api_key=None)
    admitted = reserve(auth, prompt_tokens=1_000, max_tokens=1_000)
    record = {"request_id": admitted.request_id, "tenant_id": tenant.pk, "api_key_id": None, "model": MODEL,
              "tier": tier.name, "prompt_tokens": 1_000, "cached_tokens": 0, "completion_tokens": 1_000,
              "finish_reason": "length"}
    record_write(tenant, **record)
    admission_settle_records([record])
    redis_backend.redis.flushdb()  # db 7: this suite's own
    with pytest.raises(InsufficientQuota) as refused:  # the $0.002 spent is rebuilt from the ledger
        reserve(auth, prompt_tokens=1_000, max_tokens=1_000)
    assert "Used $0.002" in refused.value.message
    assert reserve(auth, prompt_tokens=500, max_tokens=500).reserved


def test_redis_unreachable_admits_nothing(tenant_factory, tier_factory):
    from tenants.services.api_keys import AuthContext

    reset_admission_backend(RedisAdmission(url="redis://127.0.0.1:1/0"))
    tenant = tenant_factory(tier=tier_factory(requests_per_minute=3))
    with pytest.raises(ServiceUnavailable) as refused:
        reserve(AuthContext(tenant=tenant, tier=tenant.tier, api_key=None), prompt_tokens=1, max_tokens=1)
    assert refused.value.code == "limits_unavailable" and refused.value.status_code == 503


def test_an_overlapped_settlement_with_redis_away_says_so_and_raises_nothing(redis_backend, tenant_factory,
                                                                           tier_factory, price_factory):
    """The worker's settlement (billing.services.admission_settle.admission_settle_start) on a Redis that went away
    after the admission: False (the spool keeps the record unsettled and retries), no exception."""
    from billing.services.admission_settle import admission_settle_start
    from tenants.services.api_keys import AuthContext

    price_factory(model=MODEL, input="1", cached="1", output="1", effective_from=datetime(2020, 1, 1, tzinfo=timezone.utc))
    tier = tier_factory(requests_per_minute=100, tokens_per_minute=0, max_concurrent_requests=5, monthly_token_quota=0)
    tenant = tenant_factory(tier=tier)
    auth = AuthContext(tenant=tenant, tier=tier, api_key=None)
    admitted = reserve(auth, prompt_tokens=10, max_tokens=10)
    record = {"request_id": admitted.request_id, "tenant_id": tenant.pk, "model": MODEL, "tier": tier.name,
              "prompt_tokens": 10, "cached_tokens": 0, "completion_tokens": 5, "finish_reason": "stop"}
    reset_admission_backend(RedisAdmission(url="redis://127.0.0.1:1/0"))  # nothing listens on port 1
    assert admission_settle_start([record])() is False
    reset_admission_backend(redis_backend)
    assert admission_settle_start([record])() is True
    assert redis_backend.held() == (0, 0)  # the reservation and its slot, settled by the second try


def test_an_overlapped_settlement_survives_a_redis_that_forgot_its_scripts(redis_backend, tenant_factory,
                                                                         tier_factory, price_factory):
    """The settlement is sent as EVALSHA before the worker's insert; after a Redis restart (SCRIPT FLUSH here)
    the reply is NOSCRIPT, the script did not run, and finishing loads and runs it: settled once."""
    from billing.services.admission_settle import admission_settle_start
    from tenants.services.api_keys import AuthContext

    price_factory(model=MODEL, input="1", cached="1", output="1", effective_from=datetime(2020, 1, 1, tzinfo=timezone.utc))
    tier = tier_factory(requests_per_minute=100, tokens_per_minute=0, max_concurrent_requests=1, monthly_token_quota=0)
    tenant = tenant_factory(tier=tier, monthly_spend_limit_micros=1_000)
    auth = AuthContext(tenant=tenant, tier=tier, api_key=None)
    records = []
    for _ in range(2):
        admitted = reserve(auth, prompt_tokens=10, max_tokens=10)  # the second needs the first's slot back
        records.append({"request_id": admitted.request_id, "tenant_id": tenant.pk, "model": MODEL,
                        "tier": tier.name, "prompt_tokens": 10, "cached_tokens": 0, "completion_tokens": 5,
                        "finish_reason": "stop"})
        redis_backend.redis.script_flush()
        assert admission_settle_start(records[-1:])() is True
        assert redis_backend.held() == (0, 0)
    spend = [int(redis_backend.redis.get(k)) for k in redis_backend.redis.scan_iter(match=redis_backend.prefix + ":q:*:spend")]
    assert spend == [2 * 15_000]  # 15 tokens at $1/M each, in nano-dollars: each settled once


def test_an_overlapped_settlement_survives_its_connection_closed_by_the_server(redis_backend, tenant_factory,
                                                                             tier_factory, price_factory):
    """The worker's settlement keeps its own connection between steps; Redis restarting closes it. The next
    settlement goes once more through the pool (which reconnects) instead of failing: its concurrency slot is free
    at once, not after the spool's retry (a client with one slot would get a 429 meanwhile)."""
    from billing.services.admission_settle import admission_settle_start
    from tenants.services.api_keys import AuthContext

    price_factory(model=MODEL, input="1", cached="1", output="1", effective_from=datetime(2020, 1, 1, tzinfo=timezone.utc))
    tier = tier_factory(requests_per_minute=100, tokens_per_minute=0, max_concurrent_requests=1, monthly_token_quota=0)
    tenant = tenant_factory(tier=tier)
    auth = AuthContext(tenant=tenant, tier=tier, api_key=None)

    def settle_one() -> bool:
        admitted = reserve(auth, prompt_tokens=10, max_tokens=10)
        return admission_settle_start([{"request_id": admitted.request_id, "tenant_id": tenant.pk, "model": MODEL,
                                        "tier": tier.name, "prompt_tokens": 10, "cached_tokens": 0,
                                        "completion_tokens": 5, "finish_reason": "stop"}])()

    assert settle_one() is True  # opens and keeps the settlement's connection
    conn = redis_backend._settle_conn
    conn.send_command("CLIENT", "ID")
    redis_backend.redis.client_kill_filter(_id=conn.read_response())  # as a restart would: closed by the server
    assert settle_one() is True
    assert redis_backend.held() == (0, 0)
    assert settle_one() is True  # and the one after, on the new connection
