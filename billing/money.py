"""Money units, their bounds and the one cost rule. Pure Python, no Django.

Costs are integers of **femto-dollars** (1 USD = 10**15 femto-dollars). A price
is USD per million tokens with at most 6 decimal places, i.e. a whole number
of pico-dollars (1e-12 USD) per token; a tier's price multiplier has at most 3
decimal places (thousandths). Their product, tokens x pico-dollars x
thousandths, is therefore an exact integer of femto-dollars: no request's cost
is ever rounded. Rounding happens once, on an invoice line (`cents_round`).

Batch prices (the Batch API, `/v1/batches`): a price version carries a batch
discount, an integer percent (0 to 100, default 50 as OpenAI's). A batch
line is priced at the version's batch price, `batch_terms`: each kind's
pico-dollars per token (input, cached input, output: the discount applies
to all three, and so composes with the cache-hit price) times (100 - the
percent) / 100, rounded once, half to even, to a whole pico-dollar per
token, i.e. the batch price per 1M tokens at the price's 6 decimal places
(exact whenever that price has them, as 50% of any price with an even last
digit does). The line's cost is then the same exact product as a live
request's, with the batch price in place of the list price.

Where each amount lives, and its ceiling:

- Stored amounts (a usage record's costs, the hourly and daily rollups, an
  adjustment) are femto-dollar columns of up to 38 digits
  (billing.models.femtos.FemtosField: NUMERIC(38, 0) on PostgreSQL, exact
  decimal text on SQLite): 10**23 USD per row on PostgreSQL, 9.2e12 USD per
  row and per SQL sum on SQLite. Every SQL sum of them is exact
  (`FemtoSum`: numeric on PostgreSQL; on SQLite, whose SUM is 64-bit and
  raises "integer overflow" past 9,223 USD of femto-dollars, two 64-bit
  parts). Python's ints, which the figures are added in after the query, are
  unbounded.
- Prices: at most MAX_PRICE_PER_MILLION (10,000 USD per 1M tokens of any
  kind; `price_check`, applied wherever a price is set and when prices are
  loaded). The dearest list prices today are about 600 USD per 1M output
  tokens, so this leaves a margin of more than 15x while refusing a typo of
  a few extra digits. The column (NUMERIC(12, 6)) holds up to 999,999.999999.
  One record at the bound, the longest context a model row can declare
  (2**31 - 1 tokens) and the largest tier multiplier (999.999) costs
  2.1e25 femto-dollars (2.1e10 USD): inside both ceilings.
- Invoices: integer cents (64-bit: 9.2e16 USD) and each line's exact sum as
  decimal text.
- Admission's budget counters (Redis, or the in-process backend's Python
  ints) count **nano-dollars** (each record's cost rounded up, billing.
  counters.units: the one conversion of each); budgets are set in micro-dollars (64-bit:
  9.2e12 USD). A Redis counter is a 64-bit integer (INCRBY: 9.2e18
  nano-dollars, 9.2e9 USD per tenant or key and month), changed by amounts
  its Lua scripts handle as doubles (billing.counters.redis_scripts): each
  amount (a request's reservation, a settlement's correction) is exact below
  2**53 nano-dollars (9.0e6 USD), and a counter past that is compared with its
  limit to within a few nano-dollars. A budget check is all they serve; the
  ledger and the invoices stay exact whatever the counters hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Decimal

FEMTOS_PER_USD = 10**15
PICOS_PER_USD = 10**12
CENT = Decimal("0.01")
PRICE_PLACES = 6  # USD per million tokens
MULTIPLIER_PLACES = 3
MAX_PRICE_PER_MILLION = Decimal(10_000)  # USD per 1M tokens: see the module docstring
DEFAULT_BATCH_DISCOUNT_PERCENT = 50  # the Batch API's discount on every kind of token (OpenAI's: half price)


def price_check(value) -> Decimal:
    """A price as set by an operator (USD per 1M tokens): a finite Decimal between 0 and
    MAX_PRICE_PER_MILLION with at most PRICE_PLACES decimal places; ValueError (its message for the
    operator) otherwise. The one rule for the CLI, the admin, the model's clean() and the price loader."""
    try:
        price = Decimal(str(value).strip())
    except (ArithmeticError, ValueError):
        raise ValueError(f"a price is a number of USD per 1M tokens, not {value!r}") from None
    if not price.is_finite():
        raise ValueError(f"a price is a finite number, not {value!r}")
    if price < 0 or price > MAX_PRICE_PER_MILLION:
        raise ValueError(f"a price is between 0 and {MAX_PRICE_PER_MILLION} USD per 1M tokens, not {value}")
    if price != price.quantize(Decimal(1).scaleb(-PRICE_PLACES)):
        raise ValueError(f"a price has at most {PRICE_PLACES} decimal places, not {value}")
    return price


def batch_discount_check(value) -> int:
    """A batch discount as set by an operator: a whole percent from 0 to 100; ValueError (its message for the
    operator) otherwise."""
    text = str(value).strip().removesuffix("%")
    try:
        percent = Decimal(text)
    except (ArithmeticError, ValueError):
        raise ValueError(f"a batch discount is a whole percent from 0 to 100, not {value!r}") from None
    if not percent.is_finite() or percent != percent.to_integral_value() or not 0 <= percent <= 100:
        raise ValueError(f"a batch discount is a whole percent from 0 to 100, not {value!r}")
    return int(percent)


def _discounted(picos: int, percent: int) -> int:
    """picos x (100 - percent) / 100, rounded half to even to a whole pico-dollar (exact integers)."""
    whole, rest = divmod(picos * (100 - percent), 100)
    if rest * 2 > 100 or (rest * 2 == 100 and whole % 2):
        whole += 1
    return whole


def batch_terms(terms: PriceTerms, percent: int) -> PriceTerms:
    """The batch price of a version: every kind of token `percent` off, half to even to a whole pico-dollar per
    token (see the module docstring). The price id stays the version's (the record's `batch_id` says which)."""
    percent = batch_discount_check(percent)
    return PriceTerms(
        price_id=terms.price_id,
        input_picos=_discounted(terms.input_picos, percent),
        cached_input_picos=_discounted(terms.cached_input_picos, percent),
        output_picos=_discounted(terms.output_picos, percent),
    )


def batch_per_million(price: Decimal, percent: int) -> Decimal:
    """A list price (USD per 1M tokens) as its batch price: the same rule as `batch_terms`, at 6 places."""
    return Decimal(_discounted(per_million_to_picos(price), batch_discount_check(percent))).scaleb(-PRICE_PLACES)


def per_million_to_picos(price: Decimal) -> int:
    """USD per million tokens (<= 6 places) -> pico-dollars per token; refuses more precision."""
    picos = Decimal(price) * 10**PRICE_PLACES
    if not picos.is_finite() or picos != picos.to_integral_value():
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


def cached_clamp(*, prompt_tokens: int, cached_tokens: int) -> int:
    """Cached tokens as billed: never below 0 nor above the prompt (billing.ledger: the one clamp; pure
    Python here so that the cost rule has it too)."""
    return min(max(0, int(cached_tokens)), max(0, int(prompt_tokens)))


def cost_compute(*, terms: PriceTerms | None, multiplier_milli: int, prompt_tokens: int, cached_tokens: int,
                 completion_tokens: int, charged: bool = True) -> Cost:
    """Tokens x price x tier multiplier, per kind. `cached_tokens` is a subset of `prompt_tokens`.

    Nothing is charged without a price (an unpriced model) or when `charged` is
    False (a request that failed before its first token).
    """
    if terms is None or not charged:
        return Cost()
    cached = cached_clamp(prompt_tokens=prompt_tokens, cached_tokens=cached_tokens)
    uncached = max(0, prompt_tokens) - cached
    return Cost(
        input=uncached * terms.input_picos * multiplier_milli,
        cached_input=cached * terms.cached_input_picos * multiplier_milli,
        output=max(0, completion_tokens) * terms.output_picos * multiplier_milli,
    )
