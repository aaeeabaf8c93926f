"""The admission counters' keys: built from typed parts here (`CounterKey`), and read back here, nowhere else.

A key names what one counter counts: whose limit (a `LimitScope`, tenants.services.limits: a tenant's "t12",
a key's "k34", or a tenant's for one model "t12@<model, percent-encoded>"), which kind of limit and, for a
period's quota or budget, the period. Under the backend's prefix P ("{lim}" on Redis, none
in process):

  P:rb:SCOPE:KIND          a rate bucket (KIND: requests or tokens per minute)
  P:cc:SCOPE               a concurrency limit's slots
  P:q:SCOPE:PERIOD:KIND    a period's counter (KIND: quota, in tokens, or spend, in nano-dollars)
  <counter key>:alert:PCT  a budget alert's mark (once per threshold and period)
  P:res:RID                a request's reservation (written by the Lua scripts; `reservation_key` reads it)

These strings are the live counters' names in Redis: a rolling deploy shares them between the old code and
the new, so they never change (tests/billing/test_counter_keys.py pins them).
"""

from __future__ import annotations

from typing import NamedTuple

from tenants.services.limits import LimitScope

# Kinds of what a request takes: buckets count requests or tokens, slots concurrent requests, counters
# tokens or spend (billing.counters.base re-exports them)
REQUESTS = "requests"
TOKENS = "tokens"
CONCURRENCY = "concurrency"
QUOTA = "quota"  # a period's tokens (prompt + completion)
SPEND = "spend"  # a period's cost, nano-dollars

# What each kind counts in (money: billing.counters.units)
UNITS = {REQUESTS: "requests", TOKENS: "tokens", CONCURRENCY: "requests", QUOTA: "tokens", SPEND: "nanos"}

_RATE, _SLOTS, _PERIOD = "rb", "cc", "q"  # the key families
_FAMILY = {REQUESTS: _RATE, TOKENS: _RATE, CONCURRENCY: _SLOTS, QUOTA: _PERIOD, SPEND: _PERIOD}


class CounterKey(NamedTuple):
    """One counter: its scope, its kind (REQUESTS, TOKENS, CONCURRENCY, QUOTA or SPEND) and, for QUOTA and
    SPEND, its period ("YYYY-MM" in the tenant's zone). `render(prefix)` is its key in a backend."""

    scope: LimitScope
    kind: str
    period: str = ""

    @classmethod
    def rate(cls, scope: LimitScope, kind: str) -> "CounterKey":
        """A requests- or tokens-per-minute bucket."""
        if kind not in (REQUESTS, TOKENS):
            raise ValueError(f"a rate limit counts requests or tokens, not {kind!r}")
        return cls(scope, kind)

    @classmethod
    def concurrency(cls, scope: LimitScope) -> "CounterKey":
        return cls(scope, CONCURRENCY)

    @classmethod
    def period_total(cls, scope: LimitScope, period: str, kind: str) -> "CounterKey":
        """A period's token quota (QUOTA) or budget (SPEND)."""
        if kind not in (QUOTA, SPEND) or not period or ":" in period:
            raise ValueError(f"a period's counter is a quota or a budget of a period, not {kind!r} of {period!r}")
        return cls(scope, kind, period)

    @property
    def unit(self) -> str:
        """The unit it counts in: "requests", "tokens" or "nanos" (nano-dollars)."""
        return UNITS[self.kind]

    def render(self, prefix: str = "") -> str:
        family = _FAMILY[self.kind]
        if family == _SLOTS:
            parts = (family, str(self.scope))
        elif family == _RATE:
            parts = (family, str(self.scope), self.kind)
        else:
            parts = (family, str(self.scope), self.period, self.kind)
        return ":".join((prefix, *parts)) if prefix else ":".join(parts)

    @classmethod
    def parse(cls, key: str, *, prefix: str = "") -> "CounterKey":
        """The counter `render(prefix)` named (a refusal's or a settlement's key); ValueError otherwise."""
        if prefix:
            if not key.startswith(prefix + ":"):
                raise ValueError(f"not a counter key under {prefix!r}: {key!r}")
            key = key[len(prefix) + 1:]
        parts = key.split(":")
        try:
            if parts[0] == _SLOTS and len(parts) == 2:
                return cls.concurrency(LimitScope.parse(parts[1]))
            if parts[0] == _RATE and len(parts) == 3:
                return cls.rate(LimitScope.parse(parts[1]), parts[2])
            if parts[0] == _PERIOD and len(parts) == 4:
                return cls.period_total(LimitScope.parse(parts[1]), parts[2], parts[3])
        except ValueError as exc:
            raise ValueError(f"not a counter key: {key!r} ({exc})") from exc
        raise ValueError(f"not a counter key: {key!r}")


def alert_mark_key(counter_key: str, percent: int) -> str:
    """The mark of a budget alert: once per counter (so per scope and period) and threshold."""
    return f"{counter_key}:alert:{int(percent)}"


def slots_match(prefix: str) -> str:
    """A SCAN pattern of every concurrency limit's key under `prefix`."""
    return f"{prefix}:{_SLOTS}:*" if prefix else f"{_SLOTS}:*"


def reservation_key(prefix: str, request_id: str) -> str:
    """Where the Lua scripts keep a request's reservation (P:res:RID, billing.counters.redis_scripts): tests
    and tools that inspect Redis read it here."""
    return f"{prefix}:res:{request_id}"
