"""Invoices: a draft per tenant and period that follows the ledger, finalized after the period
ends plus ``settings.INVOICE_GRACE_HOURS`` (default 1), then immutable.

A correction after finalization (usage recorded late, an adjustment dated in
the period) is a credit note against the invoice: a finalized document whose
lines are the difference between the ledger now and what the invoice and its
earlier credit notes billed. So the invoice and its credit notes together
always bill exactly the ledger, each line rounded once (half to even).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from billing.models import Invoice, InvoiceLine, UsageRecord
from billing.periods import Period, month_containing, month_parse
from billing.services.invoice_lines import LineDraft, drafts_minus_billed, period_line_drafts
from tenants.models import Tenant


def grace() -> timedelta:
    return timedelta(hours=float(getattr(settings, "INVOICE_GRACE_HOURS", 1)))


def _write_lines(invoice: Invoice, drafts: list[LineDraft], now: datetime) -> None:
    invoice.lines.all().delete()
    InvoiceLine.objects.bulk_create([draft.line(invoice=invoice, position=i) for i, draft in enumerate(drafts)])
    invoice.total_cents = sum(draft.amount_cents for draft in drafts)
    invoice.updated_at = now


@transaction.atomic
def invoice_draft_refresh(*, tenant: Tenant, period: Period, now: datetime | None = None,
                          skip_empty: bool = False) -> Invoice | None:
    """The tenant's invoice for `period`, its draft recomputed from the ledger (a finalized one is returned
    as is). With `skip_empty`, a period with nothing to bill and no invoice yet gets none (None)."""
    now = now or timezone.now()
    drafts = period_line_drafts(tenant=tenant, start=period.start, end=period.end)
    if skip_empty and not drafts and not Invoice.objects.filter(
            tenant=tenant, period=period.label, kind=Invoice.Kind.INVOICE).exists():
        return None
    invoice, _ = Invoice.objects.select_for_update().get_or_create(
        tenant=tenant, period=period.label, kind=Invoice.Kind.INVOICE,
        defaults={"number": f"INV-{tenant.slug}-{period.label}", "timezone": period.tz,
                  "period_start": period.start, "period_end": period.end},
    )
    if invoice.is_final:
        return invoice
    _write_lines(invoice, drafts, now)
    invoice.save()
    return invoice


@transaction.atomic
def invoice_finalize(*, invoice: Invoice, now: datetime | None = None) -> Invoice:
    """Recompute the draft a last time and freeze it; refused before the period end plus the grace period."""
    now = now or timezone.now()
    if invoice.is_final:
        return invoice
    if now < invoice.period_end + grace():
        raise ValueError(f"{invoice.number} can be finalized from {(invoice.period_end + grace()).isoformat()}")
    period = month_parse(label=invoice.period, tz=invoice.timezone)
    invoice = invoice_draft_refresh(tenant=invoice.tenant, period=period, now=now)
    invoice.status, invoice.finalized_at = Invoice.Status.FINALIZED, now
    invoice.save()
    return invoice


@transaction.atomic
def invoice_correct(*, invoice: Invoice, now: datetime | None = None) -> Invoice | None:
    """A credit note for what the ledger now says beyond a finalized invoice and its credit notes, or None."""
    now = now or timezone.now()
    invoice = Invoice.objects.select_for_update().get(pk=invoice.pk)
    if not invoice.is_final:
        return None
    billed = InvoiceLine.objects.filter(invoice__in=[invoice, *invoice.credit_notes.all()])
    drafts = period_line_drafts(tenant=invoice.tenant, start=invoice.period_start, end=invoice.period_end)
    differences = drafts_minus_billed(drafts, billed)
    if not differences:
        return None
    sequence = invoice.credit_notes.count() + 1
    note = Invoice(
        tenant=invoice.tenant, kind=Invoice.Kind.CREDIT_NOTE, corrects=invoice,
        number=f"CN-{invoice.tenant.slug}-{invoice.period}-{sequence}", period=invoice.period,
        timezone=invoice.timezone, period_start=invoice.period_start, period_end=invoice.period_end,
        created_at=now, updated_at=now,
    )
    note.save()
    _write_lines(note, differences, now)
    note.status, note.finalized_at = Invoice.Status.FINALIZED, now
    note.save()
    return note


@dataclass
class CloseResult:
    drafts: list[Invoice] = field(default_factory=list)
    finalized: list[Invoice] = field(default_factory=list)
    credit_notes: list[Invoice] = field(default_factory=list)


def _tenants_billed(start: datetime, end: datetime):
    """Tenants with usage or an invoice near [start, end) (a margin covers every zone's offset)."""
    margin = timedelta(days=2)
    ids = set(UsageRecord.objects.filter(created_at__gte=start - margin, created_at__lt=end + margin)
              .order_by().values_list("tenant_id", flat=True).distinct())
    ids |= set(Invoice.objects.filter(period_start__lt=end + margin, period_end__gt=start - margin)
               .values_list("tenant_id", flat=True))
    return Tenant.objects.filter(pk__in=ids).order_by("pk")


def invoice_close_period(*, tenant: Tenant, period: Period, now: datetime, result: CloseResult) -> None:
    """Draft while the period (plus grace) runs; then finalize once, and credit-note any later change."""
    existing = Invoice.objects.filter(tenant=tenant, period=period.label, kind=Invoice.Kind.INVOICE).first()
    if existing is not None and existing.is_final:
        note = invoice_correct(invoice=existing, now=now)
        if note is not None:
            result.credit_notes.append(note)
        return
    invoice = invoice_draft_refresh(tenant=tenant, period=period, now=now, skip_empty=True)
    if invoice is None:
        return
    if now >= period.end + grace():
        result.finalized.append(invoice_finalize(invoice=invoice, now=now))
    else:
        result.drafts.append(invoice)


def invoices_close(*, period_label: str | None = None, now: datetime | None = None) -> CloseResult:
    """For every tenant with usage: the given month (YYYY-MM, each in its own zone), or else the
    current and the previous month. What the beat task and `manage.py invoices_close` run."""
    now = now or timezone.now()
    result = CloseResult()
    if period_label is not None:
        probe = month_parse(label=period_label, tz="UTC")
        for tenant in _tenants_billed(probe.start, probe.end):
            invoice_close_period(tenant=tenant, period=month_parse(label=period_label, tz=tenant.timezone),
                                 now=now, result=result)
        return result
    probe = month_containing(instant=now, tz="UTC")
    for tenant in _tenants_billed(probe.start - timedelta(days=31), now):
        current = month_containing(instant=now, tz=tenant.timezone)
        previous = month_containing(instant=current.start - timedelta(microseconds=1), tz=tenant.timezone)
        for period in (previous, current):
            invoice_close_period(tenant=tenant, period=period, now=now, result=result)
    return result
