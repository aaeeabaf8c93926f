"""Admission counts money in nano-dollars: the one money unit of the admission path.

The rest of the platform keeps its own units, and each enters admission through one function here:

- budgets are set in micro-dollars (billing.models.TenantBudget, keys: `monthly_spend_limit_micros`): `budget_micros_to_nanos`,
  where a plan is built (billing.services.admission_plan);
- costs are femto-dollars (billing.money, the usage records): `cost_femtos_to_nanos`, each request's cost
  rounded up to a whole nano-dollar (a counter is never below the ledger); the ledger's SQL sum rounds
  each record the same way (`FEMTO_DIGITS_PER_NANO`, billing.ledger).

Spend counters, `Actual.spend`, refusals and the budget alerts are all nano-dollars; `nanos_usd` writes
one for a person. Nano-dollars fit Lua's doubles exactly up to 2^53 (9 million USD a counter).
"""

from __future__ import annotations

NANOS_PER_MICRO = 1_000
FEMTOS_PER_NANO = 1_000_000
FEMTO_DIGITS_PER_NANO = 6  # FEMTOS_PER_NANO == 10 ** FEMTO_DIGITS_PER_NANO


def budget_micros_to_nanos(micros: int) -> int:
    """A budget (micro-dollars, as tenants store it) in admission's unit."""
    return int(micros) * NANOS_PER_MICRO


def cost_femtos_to_nanos(femtos: int) -> int:
    """A cost (femto-dollars, as billing stores it) in admission's unit, rounded up."""
    return -(-int(femtos) // FEMTOS_PER_NANO)


def nanos_usd(nanos: int) -> str:
    """Nano-dollars as USD with 2 to 6 decimals, rounded up (a limit is never shown lower than what is used)."""
    micros = -(-int(nanos) // NANOS_PER_MICRO)
    whole, frac = f"{micros // 1_000_000}.{micros % 1_000_000:06d}".rstrip("0").split(".")
    return f"{whole}.{frac.ljust(2, '0')}"
