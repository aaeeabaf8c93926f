"""Rebuilding a period's admission counter from the ledger (the usage records).

The ledger's sums are billing.ledger's (`ledger_totals`, the charged filter, the clamp).

Redis (or the in-process backend) is a cache of the ledger, never the truth.
A missing counter is rebuilt before anything is admitted on it: the period's
usage records (PostgreSQL) plus the reservations still open on it. The open
reservations are read first, then the ledger: a request settling in between
is then counted twice (its reservation and its record), never zero times,
until the counter is next rebuilt, so a rebuild can only err on the safe side.
A Redis flush also loses the open reservations of requests in flight: their
records count from the next rebuild on (each period's counter expires a week
after the period ends), so a flush forgets at most what was in flight.

Units match the admission plan: quota counters hold tokens (prompt plus
completion of every charged request), spend counters nano-dollars, each
request's cost rounded up to a whole nano-dollar (billing.counters.units: so
the counter is never below the ledger).
"""

from __future__ import annotations

import logging
from datetime import datetime

from billing.counters.keys import CounterKey
from billing.ledger import ledger_totals
from tenants.services.limits import LimitScope

logger = logging.getLogger(__name__)


def ledger_total(*, scope: LimitScope, kind: str, start: datetime, end: datetime) -> int:
    """The period's settled usage of one scope from the usage records (tokens, or nano-dollars)."""
    return ledger_totals(scope=scope, kinds=(kind,), start=start, end=end)[kind]


def counter_rebuild(*, backend, key: str, start: datetime, end: datetime, ttl_s: int) -> bool:
    """Seed a missing counter from the ledger plus its open reservations (False: another process did)."""
    counter = CounterKey.parse(key, prefix=backend.prefix)
    reserved = backend.open_reserved(key)  # first: see the module's docstring
    value = ledger_total(scope=counter.scope, kind=counter.kind, start=start, end=end) + reserved
    seeded = backend.counter_seed(key, value, ttl_s)
    if seeded:
        logger.info("admission counter %s rebuilt from the ledger: %d (%d reserved)", key, value, reserved)
    return seeded
