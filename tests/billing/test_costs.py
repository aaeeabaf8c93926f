"""Each usage record carries its cost, frozen in the INSERT that writes it."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError

from billing.models import Adjustment, UsageRecord
from billing.money import FEMTOS_PER_USD
from billing.services.adjustments import adjustment_create
from billing.services.costs import instant, usage_cost
from billing.services.usage import usage_record_create, usage_records_insert
from tests.billing.conftest import T0


def usd(record_field: int) -> Decimal:
    return Decimal(record_field) / FEMTOS_PER_USD


@pytest.mark.django_db
def test_record_cost_per_kind_with_the_tier_multiplier(tenant_factory, tier_factory, price_factory, record_write):
    price = price_factory(input="2.5", cached="1.25", output="10")
    tenant = tenant_factory(tier=tier_factory(price_multiplier=Decimal("0.9")))
    record = record_write(tenant, prompt_tokens=1000, cached_tokens=400, completion_tokens=50)
    assert record.price_id == price.pk and record.price_multiplier == Decimal("0.9")
    assert usd(record.input_cost_femtos) == Decimal(600) * Decimal("2.5") / 10**6 * Decimal("0.9")
    assert usd(record.cached_input_cost_femtos) == Decimal(400) * Decimal("1.25") / 10**6 * Decimal("0.9")
    assert usd(record.output_cost_femtos) == Decimal(50) * 10 / 10**6 * Decimal("0.9")
    assert record.cost_femtos == record.cost.total
    assert record.admitted_at == T0


@pytest.mark.django_db
def test_the_version_in_force_at_admission_applies(tenant, price_factory, record_write):
    old = price_factory(input="1", effective_from=T0)
    new = price_factory(input="3", effective_from=T0 + timedelta(days=10))
    before = record_write(tenant, admitted_at=T0 + timedelta(days=10) - timedelta(microseconds=1), completion_tokens=0)
    after = record_write(tenant, admitted_at=T0 + timedelta(days=10), completion_tokens=0)
    assert (before.price_id, after.price_id) == (old.pk, new.pk)
    assert (usd(before.cost_femtos), usd(after.cost_femtos)) == (Decimal("0.001"), Decimal("0.003"))


@pytest.mark.django_db
def test_a_replayed_finish_is_billed_once(tenant, price_factory, record_write):
    price_factory()
    first = record_write(tenant, request_id="replay", completion_tokens=10)
    # the reaper (or a slow worker) ends the same request again, with other numbers
    usage_records_insert([dict(request_id="replay", tenant_id=tenant.pk, api_key_id=None, model="m",
                               tier=tenant.tier.name, prompt_tokens=5000, completion_tokens=900,
                               finish_reason="error", admitted_at=T0)])
    usage_record_create(request_id="replay", tenant_id=tenant.pk, api_key_id=None, model="m", tier=tenant.tier.name,
                        prompt_tokens=7, completion_tokens=7, finish_reason="stop", admitted_at=T0)
    [again] = UsageRecord.objects.filter(request_id="replay")
    assert (again.cost_femtos, again.completion_tokens) == (first.cost_femtos, 10)


@pytest.mark.django_db
def test_an_aborted_stream_pays_for_its_generated_tokens_only(tenant, price_factory, record_write):
    price_factory(input="0", cached="0", output="4")
    record = record_write(tenant, finish_reason="abort", prompt_tokens=0, completion_tokens=17)
    assert usd(record.cost_femtos) == Decimal(17) * 4 / 10**6


@pytest.mark.django_db
def test_an_error_before_the_first_token_costs_nothing(tenant, price_factory, record_write):
    price_factory()
    failed = record_write(tenant, finish_reason="error", prompt_tokens=500, completion_tokens=0, error="boom")
    assert failed.cost_femtos == 0 and failed.cost.total == 0
    late = record_write(tenant, finish_reason="error", prompt_tokens=500, completion_tokens=3, error="died")
    assert late.output_cost_femtos > 0 and late.input_cost_femtos > 0


@pytest.mark.django_db
def test_an_unpriced_model_is_recorded_free_and_shows_no_version(tenant, record_write):
    record = record_write(tenant, model="nobody-priced-me")
    assert record.price_id is None and record.cost_femtos == 0


@pytest.mark.django_db
def test_the_client_cost_equals_the_records(tenant, price_factory, record_write):
    price_factory(input="0.15", cached="0.075", output="0.6")
    record = record_write(tenant, prompt_tokens=321, cached_tokens=64, completion_tokens=77)
    cost = usage_cost(model="m", tier=tenant.tier.name, admitted_at=instant(T0.timestamp()), prompt_tokens=321,
                      cached_tokens=64, completion_tokens=77, finish_reason="stop")[2].as_usd()  # as the worker does
    assert Decimal(cost["total"]) == usd(record.cost_femtos)
    assert Decimal(cost["cached_input"]) == usd(record.cached_input_cost_femtos)


@pytest.mark.django_db
def test_a_new_price_in_this_process_is_seen_at_once(tenant, price_factory, record_write):
    record_write(tenant, request_id="before-price")
    price_factory()
    assert record_write(tenant, request_id="after-price").cost_femtos > 0


@pytest.mark.django_db
def test_adjustments_are_entries_with_reason_and_operator(tenant):
    operator = get_user_model().objects.create_user("ops", password="a-long-test-password-1")
    credit = adjustment_create(tenant=tenant, kind="credit", amount_usd="1.25", reason="outage", operator=operator)
    assert credit.signed_femtos == -125 * 10**13
    with pytest.raises(ValueError, match="never edited"):
        credit.save()
    with pytest.raises(ValidationError):
        adjustment_create(tenant=tenant, kind="credit", amount_usd="1", reason=" ", operator=operator)
    with pytest.raises(ValidationError):
        adjustment_create(tenant=tenant, kind="debit", amount_usd="-1", reason="x", operator=operator)
    assert Adjustment.objects.count() == 1
