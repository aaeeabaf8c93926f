"""A request's cost, from the price version in force at its admission and its tier's multiplier.

`usage_cost` is the one function that prices a request (a test,
tests/billing/test_one_pricing_function.py, fails if another module does
the arithmetic). The worker calls it once, where the request ends
(billing.services.settlement.ending_make): its `Priced` result travels with
the request's `Ending` to the usage record (frozen in its INSERT,
`usage_records_insert`), the admission settlement and the client's
`usage.cost`. The read-side fallbacks (a record given without its price:
`usage_rows_cost`, `admission_settle.record_actual`) call it too.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from datetime import timezone as dt_timezone
from decimal import Decimal
from typing import Any, NamedTuple

from django.utils import timezone

from billing.money import Cost, PriceTerms, cost_compute
from billing.services.price_cache import PricingSnapshot, pricing_snapshot


def instant(value: float | datetime | None) -> datetime:
    """Unix seconds (a job's enqueued_at) or an aware datetime -> an aware datetime; None -> now."""
    if value is None:
        return timezone.now()
    if isinstance(value, datetime):
        return value
    return datetime.fromtimestamp(float(value), tz=dt_timezone.utc)


def is_charged(*, finish_reason: str, completion_tokens: int) -> bool:
    """An error before the first token costs nothing; anything that generated tokens pays for them."""
    return not (finish_reason == "error" and completion_tokens <= 0)


class Priced(NamedTuple):
    """What `usage_cost` found for one request: its price version (None: an unpriced model, free), its
    tier's multiplier in thousandths, and its cost in femto-dollars."""

    terms: PriceTerms | None
    multiplier_milli: int
    cost: Cost


def usage_cost(
    *,
    model: str,
    tier: str,
    admitted_at: datetime,
    prompt_tokens: int,
    cached_tokens: int,
    completion_tokens: int,
    finish_reason: str,
    batch: bool = False,
    snapshot: PricingSnapshot | None = None,
) -> Priced:
    """The price version, tier multiplier and cost of one request: THE pricing function.

    A Batch API line (`batch`) is priced at the version's batch price (billing.money.batch_terms: the
    version's batch discount off every kind of token, cache hits included), and its `Priced.terms` are
    those batch terms: what the line was billed at, frozen with it."""
    snapshot = snapshot or pricing_snapshot()
    terms = snapshot.terms_at(model, admitted_at)
    if batch and terms is not None:
        terms = snapshot.batch_terms_of(terms)
    milli = snapshot.multiplier_milli(tier)
    cost = cost_compute(
        terms=terms, multiplier_milli=milli, prompt_tokens=prompt_tokens, cached_tokens=cached_tokens,
        completion_tokens=completion_tokens,
        charged=is_charged(finish_reason=finish_reason, completion_tokens=completion_tokens),
    )
    return Priced(terms, milli, cost)


def usage_rows_cost(rows: Iterable[dict[str, Any]]) -> None:
    """Add the cost columns to record rows (`usage_record_fields` output), one snapshot for all.

    A row that carries its `costing` (`usage_cost`'s `Priced` for the same fields: the worker's, computed
    once where the request ended) is not costed twice.
    """
    snapshot = None
    for row in rows:
        costing = row.pop("costing", None)
        if costing is None:
            snapshot = snapshot or pricing_snapshot()
            costing = usage_cost(
                model=row["model"], tier=row["tier"], admitted_at=row["admitted_at"],
                prompt_tokens=row["prompt_tokens"], cached_tokens=row["cached_tokens"],
                completion_tokens=row["completion_tokens"], finish_reason=row["finish_reason"],
                batch=bool(row.get("batch_id")), snapshot=snapshot,
            )
        terms, milli, cost = Priced(*costing)
        row["price_id"] = terms.price_id if terms is not None else None
        row["price_multiplier"] = Decimal(milli).scaleb(-3)
        row["input_cost_femtos"] = cost.input
        row["cached_input_cost_femtos"] = cost.cached_input
        row["output_cost_femtos"] = cost.output
        row["cost_femtos"] = cost.total

