"""Money units and the one cost rule. Pure Python, no Django.

Costs are integers of **femto-dollars** (1 USD = 10**15 femto-dollars). A price
is USD per million tokens with at most 6 decimal places, i.e. a whole number
of pico-dollars (1e-12 USD) per token; a tier's price multiplier has at most 3
decimal places (thousandths). Their product, tokens x pico-dollars x
thousandths, is therefore an exact integer of femto-dollars: no request's cost
is ever rounded. Rounding happens once, on an invoice line (`cents_round`).

A 64-bit column holds 9.2e18 femto-dollars, 9,223 USD: far above one request,
and above one rollup row (a tenant, key, model and tier in one hour) for this
platform's models; invoice amounts are summed in Python's unbounded ints.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Decimal

FEMTOS_PER_USD = 10**15
PICOS_PER_USD = 10**12
CENT = Decimal("0.01")
PRICE_PLACES = 6  # USD per million tokens
MULTIPLIER_PLACES = 3


def per_million_to_picos(price: Decimal) -> int:
    """USD per million tokens (<= 6 places) -> pico-dollars per token; refuses more precision."""
    picos = Decimal(price) * 10**PRICE_PLACES
    if picos != picos.to_integral_value():
        raise ValueError(f"a price has at most {PRICE_PLACES} decimal places, not {price}")
    return int(picos)


def multiplier_to_milli(multiplier: Decimal) -> int:
    milli = Decimal(multiplier) * 10**MULTIPLIER_PLACES
    if milli != milli.to_integral_value():
        raise ValueError(f"a price multiplier has at most {MULTIPLIER_PLACES} decimal places, not {multiplier}")
    return int(milli)


def femtos_to_usd(femtos: int) -> Decimal:
    """Exact: a femto-dollar amount as a Decimal of USD."""
    return Decimal(int(femtos)).scaleb(-15)


def usd_str(femtos: int) -> str:
    """A femto-dollar amount as a plain decimal string of USD, exact, no exponent ("0.0000125", "0")."""
    text = format(femtos_to_usd(femtos).normalize(), "f")
    return text


def cents_round(usd: Decimal) -> Decimal:
    """The one rounding rule: to the cent, half to even (banker's rounding)."""
    return usd.quantize(CENT, rounding=ROUND_HALF_EVEN)


@dataclass(frozen=True, slots=True)
class PriceTerms:
    """One price version in integer form: pico-dollars per token of each kind."""

    price_id: int | None
    input_picos: int
    cached_input_picos: int
    output_picos: int


@dataclass(frozen=True, slots=True)
class Cost:
    """A request's cost in femto-dollars, per token kind."""

    input: int = 0  # uncached prompt tokens
    cached_input: int = 0  # prompt tokens served from the prefix cache
    output: int = 0

    @property
    def total(self) -> int:
        return self.input + self.cached_input + self.output

    def as_usd(self) -> dict[str, str]:
        """The client-facing `usage.cost` object: USD as exact decimal strings."""
        return {
            "currency": "usd",
            "input": usd_str(self.input),
            "cached_input": usd_str(self.cached_input),
            "output": usd_str(self.output),
            "total": usd_str(self.total),
        }


def cost_compute(*, terms: PriceTerms | None, multiplier_milli: int, prompt_tokens: int, cached_tokens: int,
                 completion_tokens: int, charged: bool = True) -> Cost:
    """Tokens x price x tier multiplier, per kind. `cached_tokens` is a subset of `prompt_tokens`.

    Nothing is charged without a price (an unpriced model) or when `charged` is
    False (a request that failed before its first token).
    """
    if terms is None or not charged:
        return Cost()
    cached = min(max(0, cached_tokens), max(0, prompt_tokens))
    uncached = max(0, prompt_tokens) - cached
    return Cost(
        input=uncached * terms.input_picos * multiplier_milli,
        cached_input=cached * terms.cached_input_picos * multiplier_milli,
        output=max(0, completion_tokens) * terms.output_picos * multiplier_milli,
    )
