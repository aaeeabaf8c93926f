"""A tier's per-model limits (tenants.models.TierModelLimit) at admission, on both backends (in process and real
Redis): each model's requests and tokens per minute on counters of their own, per tenant, independent between
models, on top of the tenant-wide limits, all admitted in one atomic step or none; the headers of the tightest
limit; a refusal that says it was the model's limit. A model without a row is admitted exactly as before."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone

import pytest
from asgiref.sync import async_to_sync

from billing.counters import reset_admission_backend
from billing.counters.base import REQUESTS, TOKENS
from billing.counters.keys import CounterKey
from billing.services.admission_plan import request_scopes
from billing.services.admission_reserve import aadmission_reserve
from billing.services.admission_settle import admission_settle_records
from common.errors import RateLimited
from tenants.services.limits import LimitScope, ScopeLimits
from tests.billing.admission_helpers import backend_and_clock  # noqa: F401 - the fixture

UNLIMITED = {"requests_per_minute": 0, "tokens_per_minute": 0, "max_concurrent_requests": 0, "monthly_token_quota": 0}


@pytest.fixture
def backend(backend_and_clock):  # noqa: F811 - the imported fixture
    backend, advance = backend_and_clock
    reset_admission_backend(backend)
    backend.advance = advance
    return backend


@pytest.fixture
def tenant_with_model_limits(tenant_factory, tier_factory):
    """make(tier_fields, {model: {limit: value}}) -> AuthContext of a new tenant (no key) on a new tier."""
    from tenants.models import TierModelLimit
    from tenants.services.api_keys import AuthContext

    def make(rows: dict[str, dict], **tier_fields):
        tier = tier_factory(**{**UNLIMITED, **tier_fields})
        for model, limits in rows.items():
            TierModelLimit.objects.create(tier=tier, model_name=model, **limits)
        tenant = tenant_factory(tier=tier)
        return AuthContext(tenant=tenant, tier=tier, api_key=None)

    return make


def reserve(auth, model: str, *, prompt: int = 1, max_tokens: int = 1):
    return async_to_sync(aadmission_reserve)(auth=auth, request_id=uuid.uuid4().hex, model=model,
                                            prompt_tokens=prompt, max_tokens=max_tokens)


def refused(auth, model: str, **sizes) -> RateLimited:
    with pytest.raises(RateLimited) as caught:
        reserve(auth, model, **sizes)
    assert (caught.value.status_code, caught.value.code, caught.value.error_type) == (
        429, "rate_limit_exceeded", "rate_limit_error")
    return caught.value


def requests_headers(admission) -> tuple[str, str]:
    return admission.headers["x-ratelimit-limit-requests"], admission.headers["x-ratelimit-remaining-requests"]


def test_each_models_rpm_has_its_own_counters_and_the_tenant_wide_limit_still_holds(backend,
                                                                                   tenant_with_model_limits):
    auth = tenant_with_model_limits({"a": {"requests_per_minute": 2}, "b": {"requests_per_minute": 4}},
                                    requests_per_minute=5)
    slug = auth.tenant.slug
    assert requests_headers(reserve(auth, "a")) == ("2", "1")  # the model's limit is the tightest: shown
    assert requests_headers(reserve(auth, "a")) == ("2", "0")
    error = refused(auth, "a")
    assert (f"Rate limit reached for a in tenant {slug} (its tier's per-model limit) on requests per min (RPM): "
            f"Limit 2, Used 2, Requested 1. Please try again in ") in error.message  # 30s (Redis: its own clock)
    assert error.headers["Retry-After"] == "30"
    # b's own counters are untouched by a's; the tenant's 5 hold for both (a's refusal took none of them)
    assert requests_headers(reserve(auth, "b")) == ("5", "2")  # the tenant's 2 left are tighter than b's 3
    assert requests_headers(reserve(auth, "b")) == ("5", "1")
    assert requests_headers(reserve(auth, "c")) == ("5", "0")  # a model without a row: the tenant's only
    error = refused(auth, "b")  # b has 2 of its own left; the tenant has none
    assert f"Rate limit reached for b in tenant {slug} on requests per min (RPM): Limit 5, Used 5" in error.message
    assert "per-model" not in error.message
    backend.advance(60)
    assert requests_headers(reserve(auth, "a")) == ("2", "1")


def test_two_tenants_of_a_tier_each_have_the_models_limit(backend, tenant_with_model_limits, tenant_factory):
    from tenants.services.api_keys import AuthContext

    auth = tenant_with_model_limits({"a": {"requests_per_minute": 1}})
    other = AuthContext(tenant=tenant_factory(tier=auth.tier), tier=auth.tier, api_key=None)
    assert reserve(auth, "a").reserved and reserve(other, "a").reserved  # per tenant, not shared by the tier
    refused(auth, "a")
    refused(other, "a")


def test_a_models_tpm_reserves_prompt_plus_max_tokens_and_settles_back(backend, tenant_with_model_limits,
                                                                       price_factory):
    price_factory(model="a", effective_from=datetime(2020, 1, 1, tzinfo=timezone.utc))
    auth = tenant_with_model_limits({"a": {"tokens_per_minute": 100}}, tokens_per_minute=1_000)
    first = reserve(auth, "a", prompt=30, max_tokens=50)
    assert (first.headers["x-ratelimit-limit-tokens"], first.headers["x-ratelimit-remaining-tokens"]) == ("100", "20")
    assert "x-ratelimit-limit-requests" not in first.headers  # no requests-per-minute limit anywhere
    error = refused(auth, "a", prompt=30, max_tokens=50)
    assert ("(its tier's per-model limit) on tokens per min (TPM): Limit 100, Used 80, Requested 80."
            in error.message)
    wide = reserve(auth, "b", prompt=400, max_tokens=400)  # another model: only the tenant's 1,000 (80 used)
    assert (wide.headers["x-ratelimit-limit-tokens"], wide.headers["x-ratelimit-remaining-tokens"]) == ("1000", "120")
    # the first used 30 + 10: 40 of a's 80 come back, on a's counter and on the tenant's
    admission_settle_records([{"request_id": first.request_id, "tenant_id": auth.tenant.pk, "model": "a",
                               "tier": auth.tier.name, "prompt_tokens": 30, "cached_tokens": 0,
                               "completion_tokens": 10, "finish_reason": "stop", "admitted_at": None}])
    again = reserve(auth, "a", prompt=30, max_tokens=30)
    assert again.headers["x-ratelimit-limit-tokens"] == "100"
    assert int(again.headers["x-ratelimit-remaining-tokens"]) in (0, 1)  # 40 + 60 of 100 (a refill of a token)


def test_the_tenant_wide_refusal_takes_nothing_from_the_models_counters(backend, tenant_with_model_limits):
    """All or nothing: refused by its tenant's limit, a request leaves its model's counters as they were."""
    auth = tenant_with_model_limits({"a": {"requests_per_minute": 2}}, requests_per_minute=1)
    assert reserve(auth, "b").reserved  # the tenant's one request this minute
    error = refused(auth, "a")  # by the tenant's limit: a's 2 must still be whole
    assert "per-model" not in error.message
    auth.tier.requests_per_minute = 0  # the tenant-wide limit lifted, no time passed: a's own two, both there
    assert requests_headers(reserve(auth, "a")) == ("2", "1")
    assert requests_headers(reserve(auth, "a")) == ("2", "0")
    refused(auth, "a")


def test_a_model_without_a_row_plans_exactly_as_before(db, tenant_with_model_limits):
    auth = tenant_with_model_limits({"a": {"requests_per_minute": 2, "tokens_per_minute": 300}},
                                    requests_per_minute=5)
    assert request_scopes(auth=auth) == request_scopes(auth=auth, model_limit=None)
    assert [limits.scope for limits in request_scopes(auth=auth)] == [LimitScope.tenant(auth.tenant.pk)]
    row = auth.tier.model_limits.get(model_name="a")
    assert request_scopes(auth=auth, model_limit=row)[1] == ScopeLimits(
        scope=LimitScope.tenant_model(auth.tenant.pk, "a"), requests_per_minute=2, tokens_per_minute=300)


def test_the_models_counters_are_named_by_the_typed_keys():
    scope = LimitScope.tenant_model(12, "org/model:v1{x}")
    key = CounterKey.rate(scope, TOKENS)
    assert key.render("{lim}") == "{lim}:rb:t12@org%2Fmodel%3Av1%7Bx%7D:tokens"  # no ':' or braces of its own
    assert CounterKey.parse(key.render("{lim}"), prefix="{lim}") == key
    assert CounterKey.rate(LimitScope.tenant_model(12, "smollm2-135m-instruct"), REQUESTS).render() == (
        "rb:t12@smollm2-135m-instruct:requests")
