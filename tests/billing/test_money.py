"""The cost rule: tokens x price x tier multiplier, per kind, exact in femto-dollars."""

from decimal import Decimal

import pytest

from billing.money import (
    FEMTOS_PER_USD, Cost, PriceTerms, cents_round, cost_compute, multiplier_to_milli, per_million_to_picos, usd_str,
)


def test_prices_and_multipliers_become_exact_integers():
    assert per_million_to_picos(Decimal("0.150000")) == 150_000
    assert per_million_to_picos(Decimal("0.000001")) == 1
    assert multiplier_to_milli(Decimal("0.900")) == 900
    with pytest.raises(ValueError):
        per_million_to_picos(Decimal("0.0000001"))
    with pytest.raises(ValueError):
        multiplier_to_milli(Decimal("1.0005"))


def test_every_token_kind_with_a_tier_multiplier():
    terms = PriceTerms(price_id=1, input_picos=per_million_to_picos(Decimal("2.5")),
                       cached_input_picos=per_million_to_picos(Decimal("1.25")),
                       output_picos=per_million_to_picos(Decimal("10")))
    cost = cost_compute(terms=terms, multiplier_milli=multiplier_to_milli(Decimal("0.9")), prompt_tokens=1000,
                        cached_tokens=400, completion_tokens=50)
    # in USD: 600 x 2.5/1M x 0.9, 400 x 1.25/1M x 0.9, 50 x 10/1M x 0.9
    expected = {
        "input": Decimal(600) * Decimal("2.5") / 10**6 * Decimal("0.9"),
        "cached_input": Decimal(400) * Decimal("1.25") / 10**6 * Decimal("0.9"),
        "output": Decimal(50) * Decimal(10) / 10**6 * Decimal("0.9"),
    }
    assert Decimal(cost.input) / FEMTOS_PER_USD == expected["input"]
    assert Decimal(cost.cached_input) / FEMTOS_PER_USD == expected["cached_input"]
    assert Decimal(cost.output) / FEMTOS_PER_USD == expected["output"]
    assert cost.total == cost.input + cost.cached_input + cost.output
    usd = cost.as_usd()
    assert usd["currency"] == "usd"
    assert Decimal(usd["total"]) == sum(expected.values())
    assert usd["input"] == "0.00135" and usd["cached_input"] == "0.00045" and usd["output"] == "0.00045"


def test_smallest_price_and_multiplier_stay_exact():
    terms = PriceTerms(price_id=1, input_picos=1, cached_input_picos=1, output_picos=1)
    cost = cost_compute(terms=terms, multiplier_milli=1, prompt_tokens=1, cached_tokens=0, completion_tokens=0)
    assert cost.input == 1 and usd_str(cost.input) == "0.000000000000001"


def test_nothing_is_charged_without_a_price_or_when_not_charged():
    terms = PriceTerms(price_id=1, input_picos=5, cached_input_picos=2, output_picos=9)
    assert cost_compute(terms=None, multiplier_milli=1000, prompt_tokens=10, cached_tokens=0, completion_tokens=5) == Cost()
    assert cost_compute(terms=terms, multiplier_milli=1000, prompt_tokens=10, cached_tokens=0, completion_tokens=0,
                        charged=False).total == 0
    assert usd_str(0) == "0"


def test_cached_tokens_never_exceed_the_prompt():
    terms = PriceTerms(price_id=1, input_picos=5, cached_input_picos=2, output_picos=9)
    cost = cost_compute(terms=terms, multiplier_milli=1000, prompt_tokens=3, cached_tokens=7, completion_tokens=0)
    assert (cost.input, cost.cached_input) == (0, 3 * 2 * 1000)


@pytest.mark.parametrize(("usd", "cents"), [("0.005", "0.00"), ("0.015", "0.02"), ("0.025", "0.02"),
                                            ("1.234999", "1.23"), ("-0.015", "-0.02")])
def test_cents_round_half_even(usd, cents):
    assert cents_round(Decimal(usd)) == Decimal(cents)
