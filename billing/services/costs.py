"""A request's cost, from the price version in force at its admission and its tier's multiplier.

One rule for the usage record (frozen in its INSERT, `usage_records_insert`)
and for the client's `usage.cost` (the worker's done event): both come from
`usage_cost`, with the same per-process price snapshot.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from datetime import timezone as dt_timezone
from decimal import Decimal
from typing import Any

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


def usage_cost(
    *,
    model: str,
    tier: str,
    admitted_at: datetime,
    prompt_tokens: int,
    cached_tokens: int,
    completion_tokens: int,
    finish_reason: str,
    snapshot: PricingSnapshot | None = None,
) -> tuple[PriceTerms | None, int, Cost]:
    """(price version, tier multiplier in thousandths, cost) of one request."""
    snapshot = snapshot or pricing_snapshot()
    terms = snapshot.terms_at(model, admitted_at)
    milli = snapshot.multiplier_milli(tier)
    cost = cost_compute(
        terms=terms, multiplier_milli=milli, prompt_tokens=prompt_tokens, cached_tokens=cached_tokens,
        completion_tokens=completion_tokens,
        charged=is_charged(finish_reason=finish_reason, completion_tokens=completion_tokens),
    )
    return terms, milli, cost


def usage_rows_cost(rows: Iterable[dict[str, Any]]) -> None:
    """Add the cost columns to record rows (`usage_record_fields` output), one snapshot for all.

    A row that carries its `costing` (`usage_cost`'s result for the same fields: the worker computed it
    for the client's `usage.cost`) is not costed twice.
    """
    snapshot = None
    for row in rows:
        costing = row.pop("costing", None)
        if costing is None:
            snapshot = snapshot or pricing_snapshot()
            costing = usage_cost(
                model=row["model"], tier=row["tier"], admitted_at=row["admitted_at"],
                prompt_tokens=row["prompt_tokens"], cached_tokens=row["cached_tokens"],
                completion_tokens=row["completion_tokens"], finish_reason=row["finish_reason"], snapshot=snapshot,
            )
        terms, milli, cost = costing
        row["price_id"] = terms.price_id if terms is not None else None
        row["price_multiplier"] = Decimal(milli).scaleb(-3)
        row["input_cost_femtos"] = cost.input
        row["cached_input_cost_femtos"] = cost.cached_input
        row["output_cost_femtos"] = cost.output
        row["cost_femtos"] = cost.total

