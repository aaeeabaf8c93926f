"""The one way to read the ledger (the usage records): which records are charged and billed, the clamp of
cached tokens, the sums every figure is made of, how far the rollups reach, and a scope's settled usage.

Everything that reads the ledger goes through here: the rollups (billing.services.rollups), the usage and
costs APIs (billing.usage_buckets), invoices (billing.services.invoice_lines), the admission counters'
rebuild (billing.services.counter_rebuild), and the dashboard and console (billing.selectors). The period
helpers (months, local days and midnights, UTC hour and day floors) are billing.periods'.

- Charged: an error before the first token costs nothing and uses no quota; anything that generated tokens
  pays for them. `is_charged` (billing.services.costs) applies the rule when a record is costed; CHARGED is
  the same rule as a filter on the records.
- Billed (on an invoice): a charged record that costs something (an unpriced model's cost nothing). An
  uncharged record always costs 0, so BILLED holds exactly the records whose cost is not 0.
- The clamp: cached tokens count within the prompt (0 <= cached <= prompt). `cached_clamp` (billing.money:
  the cost rule uses it too) is applied when a record is written, so the stored columns hold it, and
  UNCACHED_INPUT is the prompt less its cached tokens.
- Batch: a Batch API line's record names its batch (`batch_id`) and was priced at its version's batch price
  (billing.money.batch_terms). BATCH selects those records, IS_BATCH is the same rule as a value to group by
  (the rollups' `batch` column, the usage API's `batch` filter and group-by, the invoices' batch lines).
- The sums: SUMS, one per figure (requests, tokens by kind, femto-dollar costs by kind: exact whatever
  the total, billing.models.femtos), the same over records, hourly and daily rollups (`figure_sum`).
"""

from __future__ import annotations

from datetime import datetime

from django.db.models import BigIntegerField, BooleanField, Count, ExpressionWrapper, F, Q, Sum
from django.db.models.functions import Cast

from billing.counters.base import QUOTA, SPEND
from billing.counters.units import FEMTO_DIGITS_PER_NANO
from billing.models import FillState, UsageRecord
from billing.models.femtos import FemtoSum
from billing.money import cached_clamp
from billing.services.costs import is_charged
from tenants.services.limits import LimitScope

__all__ = ["BATCH", "BILLED", "CHARGED", "IS_BATCH", "FIGURES", "MONEY", "ROLLUP", "SUMS", "UNCACHED_INPUT", "cached_clamp",
           "batch_filter", "figure_sum", "is_charged", "ledger_totals", "rolled_up_until"]

ROLLUP = "hourly_usage"  # the hourly rollup's FillState name (billing.services.rollups)

CHARGED = ~(Q(finish_reason=UsageRecord.FinishReason.ERROR) & Q(completion_tokens__lte=0))  # is_charged, in SQL
BILLED = CHARGED & ~Q(cost_femtos=0)  # (a cost is never negative)
UNCACHED_INPUT = F("prompt_tokens") - F("cached_tokens")
BATCH = ~Q(batch_id="")  # a Batch API line's record
IS_BATCH = ExpressionWrapper(BATCH, output_field=BooleanField())  # BATCH as a value (annotate, then group by)


def batch_filter(batch: bool) -> Q:
    """The records of batch lines (True) or of live requests (False)."""
    return BATCH if batch else ~BATCH

SUMS = {
    "requests": Count("id"),
    "input_tokens": Sum(UNCACHED_INPUT),
    "cached_input_tokens": Sum("cached_tokens"),
    "output_tokens": Sum("completion_tokens"),
    "input_cost_femtos": FemtoSum("input_cost_femtos"),
    "cached_input_cost_femtos": FemtoSum("cached_input_cost_femtos"),
    "output_cost_femtos": FemtoSum("output_cost_femtos"),
    "cost_femtos": FemtoSum("cost_femtos"),
}
FIGURES = tuple(SUMS)  # also the rollups' columns
MONEY = frozenset(name for name, total in SUMS.items() if isinstance(total, FemtoSum))

# What admission counts (billing.services.counter_rebuild): tokens of charged records (64-bit before the
# addition: two 32-bit counts of one record can pass 2**31 together), each record's cost rounded up to a
# nano-dollar (as billing.counters.units.cost_femtos_to_nanos rounds it) and summed exactly.
_COUNTED = {
    QUOTA: Sum(Cast("prompt_tokens", BigIntegerField()) + F("completion_tokens"), output_field=BigIntegerField(),
               filter=CHARGED),
    SPEND: FemtoSum("cost_femtos", ceil_digits=FEMTO_DIGITS_PER_NANO),
}


def figure_sum(name: str):
    """The SUM of a rollup column `name` (FemtoSum for the money ones)."""
    return FemtoSum(name) if name in MONEY else Sum(name)


def rolled_up_until() -> datetime | None:
    """The end of the hours the hourly rollup has filled (None before its first run)."""
    return FillState.objects.filter(name=ROLLUP).values_list("end", flat=True).first()


def ledger_totals(*, scope: LimitScope, kinds: tuple[str, ...] = (QUOTA, SPEND), start: datetime,
                  end: datetime) -> dict[str, int]:
    """The period's settled usage of one scope (a tenant, or a key and the keys it made) from the usage
    records, per kind (QUOTA: tokens, SPEND: nano-dollars), one query."""
    if not isinstance(scope, LimitScope):
        raise TypeError(f"a LimitScope, not {scope!r}")
    unknown = [kind for kind in kinds if kind not in _COUNTED]
    if unknown:
        raise ValueError(unknown[0])
    records = UsageRecord.objects.filter(created_at__gte=start, created_at__lt=end)
    if scope.is_tenant:
        records = records.filter(tenant_id=scope.id)
    elif scope.is_key:
        records = records.filter(api_key_id__in=_key_family(scope.id))
    else:  # a tenant's per-model scope limits rates only: no period counter, so no ledger total to rebuild
        raise ValueError(f"no ledger total for {scope}: only a tenant's or a key's period is counted")
    totals = records.aggregate(**{kind: _COUNTED[kind] for kind in kinds})
    return {kind: int(totals[kind] or 0) for kind in kinds}


def _key_family(key_id: int) -> list[int]:
    """The key and every key whose requests count on its counters too (those it made, and theirs: their
    `lineage` names it; tenants.services.limits.key_scopes)."""
    from tenants.models import ApiKey

    tenant_id = ApiKey.objects.filter(pk=key_id).values_list("tenant_id", flat=True).first()
    if tenant_id is None:
        return [key_id]
    made = ApiKey.objects.filter(tenant_id=tenant_id).exclude(lineage=[]).values_list("pk", "lineage")
    return [key_id, *(pk for pk, lineage in made if key_id in (lineage or []))]
