"""A request's ending (`Ending`: its usage record's fields and its cost, priced once) and the one service
that settles it: the usage record written, then the admission reservation settled.

    ending = ending_make(request_id=..., ...)   # where the request ends (the worker): priced once
    row = ending.to_json(); Ending.from_json(row)  # the worker's durable spool's copy on disk (plain JSON)
    written = endings_write(endings)            # the usage records, one INSERT, idempotent on request_id
    endings_settle_start(endings)()             # their reservations, each consumed once

The worker (inference.worker.finish) makes the endings, keeps them in its
spool (inference.worker.spool) until both calls have succeeded, and counts its
metrics from what `endings_write` returns. Nothing here knows of the worker.
`usage_cost` (billing.services.costs) is the one pricing function: an ending
priced where the request ended is never priced again; one that could not be
priced then (the price table unreadable), or an older worker's spooled row
written before endings carried their price, is priced when it is written.
A Batch API line ends the same way, through the worker (its Job's `batch_id`: inference.worker.finish):
priced at its version's batch price, recorded once on its request id (the line's, kept across retries).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any

from django.db import InterfaceError, OperationalError, connection

from billing.money import Cost, PriceTerms
from billing.services.costs import Priced, instant, usage_cost
from common.outage import Outage

logger = logging.getLogger(__name__)
_pricing_outage = Outage(logger, "pricing finished requests (database)")


@dataclass(frozen=True, slots=True)
class Ending:
    """One request's ending: its usage record's fields (billing.services.usage.usage_record_fields) and its
    `Priced` (None: not priced yet). Times are unix seconds; `admitted_at` (the job's enqueue) picks the
    price version, `created_at` is when it ended (also for a record written later)."""

    request_id: str
    tenant_id: int
    api_key_id: int | None
    model: str
    tier: str
    finish_reason: str
    admitted_at: float
    created_at: float
    endpoint: str = "chat.completions"
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None
    queued_s: float = 0.0
    ttft_s: float | None = None
    duration_s: float = 0.0
    worker_id: str = ""
    batch_id: str = ""  # a Batch API line's batch (its public id): priced at the batch price
    priced: Priced | None = None

    @property
    def cost(self) -> Cost | None:
        return None if self.priced is None else self.priced.cost

    def record_fields(self) -> dict[str, Any]:
        """`usage_record_fields`' arguments (usage_records_insert, admission's settlement), with the price
        as `costing` when it has one."""
        record = {name: getattr(self, name) for name in _RECORD_FIELDS}
        if self.priced is not None:
            record["costing"] = self.priced
        return record

    def priced_now(self) -> Ending:
        """This ending with its price (`usage_cost`, at its admission's price version): itself when it has
        one. Raises what pricing raises (billing.services.price_cache.PriceUnavailable, a lost connection)."""
        if self.priced is not None:
            return self
        return replace(self, priced=_price(self))  # (a worker's ending is priced in ending_make)

    def to_json(self) -> dict[str, Any]:
        """A JSON object of plain numbers and strings (its cost's integers stay exact)."""
        row = {name: getattr(self, name) for name in _RECORD_FIELDS}
        row["priced"] = None if self.priced is None else _priced_json(self.priced)
        return row

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> Ending:
        """`to_json`'s inverse; also reads an older spool's row (the record's fields, no `priced`: priced when
        written). A row missing a required field raises TypeError."""
        values = {k: v for k, v in row.items() if k in _RECORD_NAMES}
        priced = row.get("priced")
        return cls(**values, priced=None if priced is None else _priced_from_json(priced))


# The record's fields (all but `priced`), read once: `dataclasses.fields` per call cost more than the rest
# of a conversion (an ending is made into its record's fields for the insert and for the settlement, and
# into JSON once for the worker's spool; it comes back from JSON only when the spool retries it)
_RECORD_FIELDS = tuple(f.name for f in fields(Ending) if f.name != "priced")
_RECORD_NAMES = frozenset(_RECORD_FIELDS)


def _priced_json(priced: Priced) -> dict[str, Any]:
    terms, cost = priced.terms, priced.cost
    return {"terms": None if terms is None else {"price_id": terms.price_id, "input_picos": terms.input_picos,
                                                 "cached_input_picos": terms.cached_input_picos,
                                                 "output_picos": terms.output_picos},
            "multiplier_milli": priced.multiplier_milli,
            "cost": {"input": cost.input, "cached_input": cost.cached_input, "output": cost.output}}


def _priced_from_json(row: dict[str, Any]) -> Priced:
    terms = row.get("terms")
    return Priced(None if terms is None else PriceTerms(**terms), int(row["multiplier_milli"]), Cost(**row["cost"]))


def _price(ending: Ending) -> Priced:
    return usage_cost(model=ending.model, tier=ending.tier, admitted_at=instant(ending.admitted_at),
                      prompt_tokens=ending.prompt_tokens, cached_tokens=ending.cached_tokens,
                      completion_tokens=ending.completion_tokens, finish_reason=ending.finish_reason,
                      batch=bool(ending.batch_id))


def ending_make(**values: Any) -> Ending:
    """The `Ending` of a request that ends now (`Ending`'s fields but `priced`), priced once. A price that
    cannot be read now leaves it unpriced (said once per outage): it is priced when its record is written,
    and the request's end is never held up by pricing."""
    ending = Ending(**values)
    try:
        priced = _price(ending)
    except Exception as exc:  # noqa: BLE001 - a done event is never lost to pricing
        _pricing_outage.failed(f"{ending.request_id}: {exc!r}")
        return ending
    _pricing_outage.ok()
    return Ending(**values, priced=priced)


class DatabaseAway(Exception):
    """The database could not be reached (its connection is closed: the next try opens a fresh one)."""


def endings_write(endings: list[Ending]) -> list[Ending]:
    """Write the usage records of `endings` in one INSERT (idempotent on request_id: the first write wins)
    and return them priced, as written. DatabaseAway when the database cannot be reached; anything else
    (a price that cannot be read, a value a column refuses) is the batch's: its caller tries the records
    one by one to find the bad one."""
    from billing.services.usage import usage_records_insert

    try:
        priced = [ending.priced_now() for ending in endings]
        usage_records_insert([ending.record_fields() for ending in priced])
    except (OperationalError, InterfaceError) as exc:
        _reconnect()
        raise DatabaseAway(str(exc).strip() or repr(exc)) from exc
    return priced


def endings_settle_start(endings: list[Ending]) -> Callable[[], bool]:
    """Start settling the admission reservations of `endings` (billing.services.admission_settle: tokens refunded,
    slots freed, quota and budget counters corrected to each one's cost); the returned function waits for
    it: True when settled, False when the counters could not be reached (settling again is safe). Never
    raises."""
    from billing.services.admission_settle import admission_settle_start

    return admission_settle_start([ending.record_fields() for ending in endings])


def _reconnect() -> None:
    try:
        if connection.in_atomic_block:
            return  # not ours to close (tests wrap everything in a transaction)
        connection.close()  # the next query opens a fresh connection
    except Exception:  # noqa: BLE001
        pass
