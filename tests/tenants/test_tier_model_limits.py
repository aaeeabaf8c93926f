"""A tier's per-model limits (TierModelLimit): their scope's string form, the row's validation, and how admission
reads them: with the verified-key row (prefetched, cached with it: no query per request), fresh after any
change of a row (the cache is emptied at once), and read once for a tier that came another way."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from django.core.exceptions import ValidationError

from tenants.services.limits import LimitScope, model_limits

NAMES = ["smollm2-135m-instruct", "gemma-3-270m", "Qwen2.5-0.5B_it.v2~x", "org/model", "ft:gpt-4o:org::abc",
         "a{b}c", "with space", "mödel", "50%", "a@b"]


@pytest.mark.parametrize("name", NAMES)
def test_a_models_scope_reads_back_and_its_form_holds_no_separator(name):
    scope = LimitScope.tenant_model(12, name)
    text = str(scope)
    assert text.startswith("t12@") and not set(text) & set(":{} ")
    assert LimitScope.parse(text) == scope and hash(LimitScope.parse(text)) == hash(scope)
    assert (scope.kind, scope.id, scope.model, scope.is_tenant_model, scope.is_tenant, scope.is_key) == (
        "tenant_model", 12, name, True, False, False)
    assert scope != LimitScope.tenant(12) and scope != LimitScope.tenant_model(13, name)


def test_the_readable_names_stay_readable():
    assert str(LimitScope.tenant_model(7, "smollm2-135m-instruct")) == "t7@smollm2-135m-instruct"
    assert str(LimitScope.tenant_model(7, "org/model:v1")) == "t7@org%2Fmodel%3Av1"


@pytest.mark.parametrize("junk", ["t12@", "k12@m", "t12@m@n", "t12@m:x", "t12@%2f", "t12@%41", "t12@%ZZ", "t12@%FF",
                                  "t12@a b", "t@m", "t012@m", "t12@{m}", "t12@m\n"])
def test_parse_refuses_what_str_never_writes(junk):
    with pytest.raises(ValueError):
        LimitScope.parse(junk)


@pytest.mark.parametrize("kind, id, model", [("tenant_model", 1, ""), ("tenant", 1, "m"), ("key", 1, "m"),
                                             ("tenant_model", -1, "m"), ("tenant_model", 1, None)])
def test_a_model_goes_with_a_tenant_model_scope_only(kind, id, model):
    with pytest.raises(ValueError):
        LimitScope(kind, id, model)


def test_the_row_needs_a_name_and_a_limit(tier):
    from tenants.models import TierModelLimit

    for fields in ({"model_name": "m"}, {"model_name": " m", "requests_per_minute": 1},
                   {"model_name": "", "tokens_per_minute": 1}, {"model_name": "m", "requests_per_minute": 0}):
        with pytest.raises(ValidationError):
            TierModelLimit(tier=tier, **fields).full_clean()
    row = TierModelLimit(tier=tier, model_name="m", tokens_per_minute=500)
    row.full_clean()
    limits = model_limits(tenant=type("T", (), {"pk": 3})(), row=row)
    assert (limits.scope, limits.requests_per_minute, limits.tokens_per_minute) == (
        LimitScope.tenant_model(3, "m"), 0, 500)
    assert model_limits(tenant=type("T", (), {"pk": 3})(), row=None) is None


def _limit_of(context, model):
    from tenants.selectors import atier_model_limit

    row = async_to_sync(atier_model_limit)(tier=context.tier, model=model)
    return None if row is None else (row.requests_per_minute, row.tokens_per_minute)


def test_the_verified_key_row_brings_them_and_any_change_is_seen_at_once(settings, api_key, tenant,
                                                                        django_assert_num_queries):
    from tenants.models import TierModelLimit
    from tenants.services.api_keys import aapi_key_verify

    settings.API_KEY_CACHE_TTL_S = 3600  # only an invalidation can make a change visible
    row = TierModelLimit.objects.create(tier=tenant.tier, model_name="a", requests_per_minute=5)
    verify = async_to_sync(aapi_key_verify)
    assert _limit_of(verify(key=api_key.key), "a") == (5, None)
    with django_assert_num_queries(0):  # the hot path: the cached row, its tier's rows with it
        context = verify(key=api_key.key)
        assert _limit_of(context, "a") == (5, None) and _limit_of(context, "b") is None

    row.tokens_per_minute = 700
    row.save()
    assert _limit_of(verify(key=api_key.key), "a") == (5, 700)
    TierModelLimit.objects.create(tier=tenant.tier, model_name="b", tokens_per_minute=9)
    assert _limit_of(verify(key=api_key.key), "b") == (None, 9)
    TierModelLimit.objects.filter(model_name="a").delete()  # (a queryset delete sends post_delete per row too)
    assert _limit_of(verify(key=api_key.key), "a") is None


def test_a_tier_that_came_another_way_is_read_once(tier, django_assert_num_queries):
    from tenants.models import Tier, TierModelLimit

    TierModelLimit.objects.create(tier=tier, model_name="a", requests_per_minute=5)
    fresh = Tier.objects.get(pk=tier.pk)
    with django_assert_num_queries(1):
        assert _limit_of(type("C", (), {"tier": fresh})(), "a") == (5, None)
        assert _limit_of(type("C", (), {"tier": fresh})(), "b") is None
