"""A tier's per-model limit through the real ASGI application and the real admin: an operator adds, changes and
deletes the tier's row for a model on the Tier admin's inline, and the very next completion is admitted under
it (the verified-key cache, warm and long-lived here, is emptied by the edit), with the model's headers and,
past its limit, a 429 in OpenAI's shape that names the model's limit. The completions run on the embedded engine
with the real model; the counters on the in-process backend with an injected clock."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from asgiref.sync import sync_to_async
from django.urls import reverse

from billing.counters import reset_admission_backend
from billing.counters.memory import MemoryAdmission
from tests.billing.admission_helpers import Clock
from tests.billing.test_admission_api import _embedded_engine, _pool_closed_after  # noqa: F401 - the fixtures
from tests.inference.api_fixtures import asgi_client  # noqa: F401
from tests.inference.test_api_validation import MODEL, chat, check, post  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def clock(settings):
    settings.API_KEY_CACHE_TTL_S = 3600  # only the edit's invalidation can make the next request see it
    clock = Clock(datetime.now(timezone.utc).timestamp())
    reset_admission_backend(MemoryAdmission(clock=clock))
    return clock


@pytest.fixture
def operator(client, db):
    from django.contrib.auth import get_user_model

    client.force_login(get_user_model().objects.create_superuser("ops", "ops@example.com", "a-long-test-password-1"))
    return client


def _tier_post(operator, tier, rows: list[dict]) -> None:
    """The Tier admin's change form as a browser sends it: the tier's own fields, and the inline's rows."""
    from tenants.models import Tier

    data = {field.name: getattr(tier, field.name) for field in Tier._meta.fields if field.name != "id"}
    data["allowed_models"] = json.dumps(tier.allowed_models)
    initial = [row for row in rows if row.get("id")]
    data.update({"model_limits-TOTAL_FORMS": len(rows), "model_limits-INITIAL_FORMS": len(initial),
                 "model_limits-MIN_NUM_FORMS": 0, "model_limits-MAX_NUM_FORMS": 1000})
    for index, row in enumerate(rows):
        data.update({f"model_limits-{index}-{name}": ("" if value is None else value) for name, value in row.items()})
        data[f"model_limits-{index}-tier"] = tier.pk
    response = operator.post(reverse("admin:tenants_tier_change", args=[tier.pk]), data)
    assert response.status_code == 302, response.content.decode()[-3000:]  # saved: back to the list


async def test_an_admin_edit_of_a_models_limit_applies_to_the_next_request(asgi_client, clock, operator,
                                                                           tier_factory, tenant_factory,
                                                                           api_key_factory, served_model):
    from tenants.models import TierModelLimit

    tier = await sync_to_async(tier_factory)(requests_per_minute=10, tokens_per_minute=0, max_concurrent_requests=0,
                                             monthly_token_quota=0, allowed_models=["*"])
    tenant = await sync_to_async(tenant_factory)(tier=tier)
    key = (await sync_to_async(api_key_factory)(tenant=tenant)).key
    first = await post(asgi_client, "/v1/chat/completions", key, chat(max_tokens=1))
    assert first.status_code == 200, first.text  # the key's row is cached now, with its tier's (no) model rows
    assert first.headers["x-ratelimit-limit-requests"] == "10"

    await sync_to_async(_tier_post)(operator, tier, [
        {"model_name": MODEL, "requests_per_minute": 2, "tokens_per_minute": None},
        {"model_name": "another-model", "requests_per_minute": 1, "tokens_per_minute": None}])
    limited = await post(asgi_client, "/v1/chat/completions", key, chat(max_tokens=1, stream=True))
    assert limited.status_code == 200, limited.text
    # the model's own counter (1 of 2 left) is tighter than the tenant's (8 of 10 left): its headers are sent
    assert (limited.headers["x-ratelimit-limit-requests"], limited.headers["x-ratelimit-remaining-requests"],
            limited.headers["x-ratelimit-reset-requests"]) == ("2", "1", "30s")
    assert (await post(asgi_client, "/v1/completions", key, {"model": MODEL, "prompt": "Hi", "max_tokens": 1})
            ).status_code == 200  # (both endpoints count on the model's counter)
    response = await post(asgi_client, "/v1/chat/completions", key, chat(max_tokens=1))
    check(response, 429, param=None, code="rate_limit_exceeded", error_type="rate_limit_error")
    assert response.json()["error"]["message"] == (
        f"Rate limit reached for {MODEL} in tenant {tenant.slug} (its tier's per-model limit) on requests per min "
        f"(RPM): Limit 2, Used 2, Requested 1. Please try again in 30s.")
    assert response.headers["retry-after"] == "30" and response.headers["retry-after-ms"] == "30000"

    row = await TierModelLimit.objects.aget(tier=tier, model_name=MODEL)
    other = await TierModelLimit.objects.aget(tier=tier, model_name="another-model")
    await sync_to_async(_tier_post)(operator, tier, [  # the model's row deleted on the inline, the other kept
        {"id": row.pk, "model_name": MODEL, "requests_per_minute": 2, "tokens_per_minute": None, "DELETE": "on"},
        {"id": other.pk, "model_name": "another-model", "requests_per_minute": 1, "tokens_per_minute": None}])
    assert not await TierModelLimit.objects.filter(pk=row.pk).aexists()
    freed = await post(asgi_client, "/v1/chat/completions", key, chat(max_tokens=1))
    assert freed.status_code == 200, freed.text  # only the tenant's 10 again: 6 left (4 taken, the refusal none)
    assert (freed.headers["x-ratelimit-limit-requests"], freed.headers["x-ratelimit-remaining-requests"]) == ("10", "6")


def test_the_inline_refuses_a_duplicate_and_an_empty_row(operator, tier_factory):
    from tenants.models import Tier

    tier = tier_factory()
    data = {field.name: getattr(tier, field.name) for field in Tier._meta.fields if field.name != "id"}
    data.update({"allowed_models": json.dumps(tier.allowed_models), "model_limits-TOTAL_FORMS": 3,
                 "model_limits-INITIAL_FORMS": 0, "model_limits-MIN_NUM_FORMS": 0, "model_limits-MAX_NUM_FORMS": 1000})
    for index, (name, rpm) in enumerate([("m", 5), ("m", 6), ("n", "")]):
        data.update({f"model_limits-{index}-model_name": name, f"model_limits-{index}-requests_per_minute": rpm,
                     f"model_limits-{index}-tokens_per_minute": "", f"model_limits-{index}-tier": tier.pk})
    page = operator.post(reverse("admin:tenants_tier_change", args=[tier.pk]), data).content.decode()
    assert "Please correct the duplicate data for model_name" in page
    assert "Set requests per minute, tokens per minute or both" in page
    assert not tier.model_limits.exists()
