"""Batch prices (issue 39): a whole-percent discount on a price version (default 50%), off every kind of token
(cache hits included), rounded once, half to even, to a whole pico-dollar per token; the line's cost is then the
same exact femto-dollar product as a live request's. Set with `price_set --batch-discount`."""

from datetime import datetime, timedelta, timezone
from decimal import Decimal
from io import StringIO

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.core.management.base import CommandError

from billing.models import Price, UsageRecord
from billing.money import (
    FEMTOS_PER_USD,
    PriceTerms,
    batch_discount_check,
    batch_per_million,
    batch_terms,
    per_million_to_picos,
)
from billing.services.costs import usage_cost
from billing.services.prices import price_create
from tests.billing.conftest import T0

UTC = timezone.utc


def femtos(usd: str) -> int:
    value = Decimal(usd) * FEMTOS_PER_USD
    assert value == value.to_integral_value()
    return int(value)


def test_the_batch_price_is_the_list_price_less_the_percent_on_every_kind():
    terms = PriceTerms(price_id=3, input_picos=per_million_to_picos(Decimal("2.5")),
                       cached_input_picos=per_million_to_picos(Decimal("1.25")),
                       output_picos=per_million_to_picos(Decimal("10")))
    assert batch_terms(terms, 50) == PriceTerms(3, 1_250_000, 625_000, 5_000_000)
    assert batch_terms(terms, 0) == terms
    assert batch_terms(terms, 100) == PriceTerms(3, 0, 0, 0)
    assert batch_terms(terms, 40) == PriceTerms(3, 1_500_000, 750_000, 6_000_000)


@pytest.mark.parametrize(("price", "percent", "batch"), [
    ("0.000001", 50, "0"),         # 0.5 pico a token: half to even, down to 0
    ("0.000003", 50, "0.000002"),  # 1.5 -> 2
    ("0.000005", 50, "0.000002"),  # 2.5 -> 2
    ("0.000007", 50, "0.000004"),  # 3.5 -> 4
    ("0.000001", 33, "0.000001"),  # 0.67 -> 1
    ("1.234567", 50, "0.617284"),  # 617283.5 -> 617284
    ("1.234565", 50, "0.617282"),  # 617282.5 -> 617282
    ("10000", 50, "5000"),
    ("0.15", 25, "0.1125"),        # exact
])
def test_the_one_rounding_half_to_even_to_a_whole_pico_per_token(price, percent, batch):
    assert batch_per_million(Decimal(price), percent) == Decimal(batch)
    picos = per_million_to_picos(Decimal(price))
    assert batch_terms(PriceTerms(1, picos, picos, picos), percent).output_picos == per_million_to_picos(Decimal(batch))


@pytest.mark.parametrize("bad", ["-1", "101", "12.5", "abc", "nan", "", None])
def test_a_discount_is_a_whole_percent_from_0_to_100(bad):
    with pytest.raises(ValueError, match="whole percent"):
        batch_discount_check(bad)
    assert batch_discount_check("40%") == 40 and batch_discount_check(Decimal("100")) == 100


@pytest.mark.django_db
def test_a_batch_line_costs_the_batch_price_times_the_tier_exactly_with_cache_hits(tenant_factory, tier_factory,
                                                                                   price_factory):
    tier = tier_factory(price_multiplier=Decimal("1.5"))
    tenant = tenant_factory(tier=tier)
    price_factory(model="m", input="2.5", cached="1.25", output="10")
    args = dict(model="m", tier=tier.name, admitted_at=T0 + timedelta(hours=1), prompt_tokens=1_000_003,
                cached_tokens=400_001, completion_tokens=123_457, finish_reason="stop")
    live, batch = usage_cost(**args).cost, usage_cost(**args, batch=True).cost
    # 600,002 x 1.25 USD/M x 1.5; 400,001 x 0.625 x 1.5; 123,457 x 5 x 1.5: exact to the femto-dollar
    assert batch.input == femtos("1.12500375")
    assert batch.cached_input == femtos("0.3750009375")
    assert batch.output == femtos("0.9259275")
    assert (live.input, live.cached_input, live.output) == (2 * batch.input, 2 * batch.cached_input, 2 * batch.output)
    assert tenant  # (the tenant's tier is the one priced)


@pytest.mark.django_db
def test_each_price_version_prices_its_lines_at_its_own_discount(tenant, price_factory):
    v1 = price_factory(model="m", input="2", cached="1", output="8", effective_from=T0)
    v2 = Price.objects.create(model="m", input_per_million="3", cached_input_per_million="1.5",
                              output_per_million="12.000001", batch_discount_percent=25,
                              effective_from=T0 + timedelta(days=10))
    v3 = Price.objects.create(model="m", input_per_million="3", cached_input_per_million="1.5",
                              output_per_million="12", batch_discount_percent=0, effective_from=T0 + timedelta(days=20))
    assert v1.batch_discount_percent == 50  # the default
    args = dict(model="m", tier=tenant.tier.name, prompt_tokens=1_000_000, cached_tokens=0,
                completion_tokens=1_000_000, finish_reason="stop", batch=True)
    first = usage_cost(**args, admitted_at=T0 + timedelta(days=9, hours=23, minutes=59))
    second = usage_cost(**args, admitted_at=T0 + timedelta(days=10))
    third = usage_cost(**args, admitted_at=T0 + timedelta(days=25))
    assert first.terms.price_id == v1.pk and (first.cost.input, first.cost.output) == (femtos("1"), femtos("4"))
    # 12.000001 x 0.75 = 9.00000075 -> 9.000001 USD per 1M (a whole pico a token, half to even)
    assert second.terms.price_id == v2.pk and second.cost.output == femtos("9.000001")
    assert second.cost.input == femtos("2.25")
    assert third.terms.price_id == v3.pk and third.cost.output == femtos("12")  # 0%: the list price
    assert v2.batch_price_per_million("output_per_million") == Decimal("9.000001")


@pytest.mark.django_db
def test_a_record_of_a_batch_line_freezes_the_batch_cost(tenant, price_factory, record_write):
    price_factory(model="m", input="2", cached="1", output="8")
    live = record_write(tenant, prompt_tokens=1000, cached_tokens=200, completion_tokens=50)
    line = record_write(tenant, batch_id="batch_abc", request_id="batch_abc-1", prompt_tokens=1000,
                        cached_tokens=200, completion_tokens=50)
    assert line.batch_id == "batch_abc" and line.is_batch and not live.is_batch
    assert line.price_id == live.price_id
    assert (line.input_cost_femtos, line.cached_input_cost_femtos, line.output_cost_femtos) == (
        live.input_cost_femtos // 2, live.cached_input_cost_femtos // 2, live.output_cost_femtos // 2)
    assert line.cost_femtos == femtos("0.0011")  # 800 x 1 + 200 x 0.5 + 50 x 4 per 1M
    # a later price version changes nothing already written
    Price.objects.create(model="m", input_per_million="9", cached_input_per_million="9", output_per_million="9",
                         batch_discount_percent=10, effective_from=T0 - timedelta(days=1))
    assert UsageRecord.objects.get(pk=line.pk).cost_femtos == femtos("0.0011")


@pytest.mark.django_db
def test_price_set_takes_the_batch_discount(db):
    out = StringIO()
    call_command("price_set", "--model", "q", "--input", "2", "--cached-input", "1", "--output", "8",
                 "--batch-discount", "40", "--effective-from", "2026-01-01T00:00:00Z", stdout=out)
    price = Price.objects.get(model="q")
    assert price.batch_discount_percent == 40
    assert "batch (40% off): 1.2, 0.6, 4.8" in out.getvalue()
    call_command("price_set", "--model", "r", "--input", "2", "--cached-input", "1", "--output", "8",
                 "--effective-from", "2026-01-01T00:00:00Z", stdout=StringIO())
    assert Price.objects.get(model="r").batch_discount_percent == 50
    for bad in ("101", "12.5", "-5", "half"):
        with pytest.raises(CommandError, match="batch_discount_percent"):
            call_command("price_set", "--model", "s", "--input", "2", "--cached-input", "1", "--output", "8",
                         "--batch-discount", bad, "--effective-from", "2026-01-01T00:00:00Z", stdout=StringIO())
    assert not Price.objects.filter(model="s").exists()


@pytest.mark.django_db
def test_price_create_refuses_a_bad_discount_before_writing(db):
    with pytest.raises(ValidationError) as caught:
        price_create(model="t", input_per_million="1", cached_input_per_million="1", output_per_million="1",
                     batch_discount_percent=150, effective_from=datetime(2026, 1, 1, tzinfo=UTC))
    assert "batch_discount_percent" in caught.value.message_dict
    assert not Price.objects.filter(model="t").exists()
