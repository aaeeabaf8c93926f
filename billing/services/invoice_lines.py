"""What a tenant owes for a period, as invoice lines computed from the ledger.

Lines per model, token kind (uncached input, cached input, output), price
version, tier multiplier and live or batch (a price or tier change mid-month
gives each version its own lines; Batch API lines, priced at the version's
batch price, have their own lines, labelled), plus one line per adjustment
dated in the period.
Only records that cost something are billed (billing.ledger.BILLED: errors
before the first token, unpriced models: nothing), summed as the ledger sums
them (billing.ledger.SUMS). Each line keeps its exact cost and is rounded
once to the cent, half to even.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from billing.ledger import BILLED, IS_BATCH, SUMS
from billing.models import Adjustment, InvoiceLine, Price, UsageRecord
from billing.money import cents_round, femtos_to_usd
from tenants.models import Tenant

Key = tuple  # (kind, model, price id, multiplier text, batch) | ("adjustment", "", adjustment id, "0", False)

_KINDS = (  # line kind, tokens sum, cost sum (billing.ledger.SUMS), the price's column
    (InvoiceLine.Kind.INPUT, "input_tokens", "input_cost_femtos", "input_per_million"),
    (InvoiceLine.Kind.CACHED_INPUT, "cached_input_tokens", "cached_input_cost_femtos", "cached_input_per_million"),
    (InvoiceLine.Kind.OUTPUT, "output_tokens", "output_cost_femtos", "output_per_million"),
)
_LINE_SUMS = {name: SUMS[name] for _kind, tokens, femtos, _column in _KINDS for name in (tokens, femtos)}


@dataclass(slots=True)
class LineDraft:
    kind: str
    model: str
    price_id: int | None
    multiplier: Decimal
    quantity: int
    femtos: int
    description: str
    unit_price: str = ""
    adjustment_id: int | None = None
    batch: bool = False

    @property
    def key(self) -> Key:
        if self.adjustment_id is not None:
            return (self.kind, "", self.adjustment_id, "0", False)
        return (self.kind, self.model, self.price_id, format(self.multiplier.normalize(), "f"), self.batch)

    @property
    def amount_cents(self) -> int:
        return int(cents_round(femtos_to_usd(self.femtos)) * 100)

    def line(self, *, invoice, position: int) -> InvoiceLine:
        return InvoiceLine(
            invoice=invoice, position=position, kind=self.kind, model=self.model, batch=self.batch,
            price_id=self.price_id, adjustment_id=self.adjustment_id,
            price_multiplier=self.multiplier, description=self.description[:300], quantity=self.quantity,
            unit_price_per_million=self.unit_price, exact_usd=format(femtos_to_usd(self.femtos), "f"),
            amount_cents=self.amount_cents,
        )


def _plain(value: Decimal) -> str:
    return format(value.normalize(), "f")


def usage_line_drafts(*, tenant: Tenant, start: datetime, end: datetime) -> list[LineDraft]:
    groups = list(
        UsageRecord.objects.filter(BILLED, tenant=tenant, created_at__gte=start, created_at__lt=end)
        .annotate(batch=IS_BATCH)
        .order_by()
        .values("model", "price_id", "price_multiplier", "batch")
        .annotate(**_LINE_SUMS)
    )
    prices = Price.objects.in_bulk({group["price_id"] for group in groups})
    drafts = []
    for group in sorted(groups, key=lambda g: (g["model"], bool(g["batch"]), prices[g["price_id"]].effective_from)):
        price, batch = prices[group["price_id"]], bool(group["batch"])
        multiplier = Decimal(group["price_multiplier"])
        for kind, tokens, femtos, column in _KINDS:
            if not group[tokens] and not group[femtos]:
                continue
            unit = (price.batch_price_per_million(column) if batch else getattr(price, column)) * multiplier
            note = f" x tier {_plain(multiplier)}" if multiplier != 1 else ""
            label = f"{group['model']} (batch, {price.batch_discount_percent}% off)" if batch else group["model"]
            drafts.append(LineDraft(
                kind=kind, model=group["model"], price_id=price.pk, multiplier=multiplier, batch=batch,
                quantity=int(group[tokens]), femtos=int(group[femtos]), unit_price=_plain(unit),
                description=(f"{label}: {InvoiceLine.Kind(kind).label}, price from "
                             f"{price.effective_from:%Y-%m-%d %H:%M} UTC (#{price.pk}){note}"),
            ))
    return drafts


def adjustment_line_drafts(*, tenant: Tenant, start: datetime, end: datetime) -> list[LineDraft]:
    drafts = []
    for adjustment in Adjustment.objects.filter(tenant=tenant, effective_at__gte=start, effective_at__lt=end).order_by(
            "effective_at", "pk"):
        drafts.append(LineDraft(
            kind=InvoiceLine.Kind.ADJUSTMENT, model="", price_id=None, adjustment_id=adjustment.pk,
            multiplier=Decimal(0), quantity=1,
            femtos=adjustment.signed_femtos, description=f"{adjustment.get_kind_display()}: {adjustment.reason}",
        ))
    return drafts


def period_line_drafts(*, tenant: Tenant, start: datetime, end: datetime) -> list[LineDraft]:
    return usage_line_drafts(tenant=tenant, start=start, end=end) + adjustment_line_drafts(
        tenant=tenant, start=start, end=end)


def line_key(line: InvoiceLine) -> Key:
    if line.adjustment_id is not None:
        return (line.kind, "", line.adjustment_id, "0", False)
    return (line.kind, line.model, line.price_id, format(Decimal(line.price_multiplier).normalize(), "f"),
            bool(line.batch))


def drafts_minus_billed(drafts: Iterable[LineDraft], billed: Iterable[InvoiceLine]) -> list[LineDraft]:
    """What `drafts` (the ledger now) adds to the `billed` lines (an invoice and its credit notes), per key."""
    done: dict[Key, tuple[int, int]] = {}
    for line in billed:
        quantity, femtos = done.get(line_key(line), (0, 0))
        femtos_line = int(Decimal(line.exact_usd).scaleb(15))
        done[line_key(line)] = (quantity + line.quantity, femtos + femtos_line)
    differences = []
    for draft in drafts:
        quantity, femtos = done.pop(draft.key, (0, 0))
        if (draft.quantity, draft.femtos) != (quantity, femtos):
            draft.quantity -= quantity
            draft.femtos -= femtos
            differences.append(draft)
    return differences
