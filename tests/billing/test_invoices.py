"""Invoices: lines per model, kind and price version; finalized after the grace period, then immutable;
later changes as credit notes; totals reconcile with the ledger."""

import random
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest
import time_machine
from django.contrib.auth import get_user_model
from django.core.management import call_command

from billing.models import Invoice, InvoiceLine, UsageRecord
from billing.money import FEMTOS_PER_USD
from billing.periods import month_parse
from billing.services.adjustments import adjustment_create
from billing.services.invoices import invoice_draft_refresh, invoice_finalize, invoices_close

UTC = timezone.utc
LA = "America/Los_Angeles"
MARCH_LA = month_parse(label="2026-03", tz=LA)  # 2026-03-01T08:00Z .. 2026-04-01T07:00Z (DST inside)


def at(when, write, *args, **kwargs):
    with time_machine.travel(when, tick=False):
        return write(*args, **kwargs)


def ledger_femtos(tenant, period) -> int:
    return sum(UsageRecord.objects.filter(tenant=tenant, created_at__gte=period.start, created_at__lt=period.end)
               .values_list("cost_femtos", flat=True))


def billed_cents(invoice) -> int:
    return sum(InvoiceLine.objects.filter(invoice__in=[invoice, *invoice.credit_notes.all()])
               .values_list("amount_cents", flat=True))


@pytest.fixture
def la_tenant(tenant_factory, tier_factory):
    return tenant_factory(tier=tier_factory(price_multiplier=Decimal("1.5")), timezone=LA)


@pytest.mark.django_db
def test_a_price_change_mid_month_bills_each_version_on_its_own_lines(la_tenant, price_factory, record_write):
    v1 = price_factory(input="2", cached="1", output="8", effective_from=datetime(2026, 1, 1, tzinfo=UTC))
    v2 = price_factory(input="3", cached="1.5", output="12", effective_from=datetime(2026, 3, 15, tzinfo=UTC))
    for day, admitted in ((5, datetime(2026, 3, 5, tzinfo=UTC)), (20, datetime(2026, 3, 20, tzinfo=UTC))):
        for _ in range(3):
            at(datetime(2026, 3, day, 12, tzinfo=UTC), record_write, la_tenant, admitted_at=admitted,
               prompt_tokens=400_000, cached_tokens=100_000, completion_tokens=50_000)
    invoice = invoice_draft_refresh(tenant=la_tenant, period=MARCH_LA, now=datetime(2026, 3, 25, tzinfo=UTC))
    lines = list(invoice.lines.all())
    assert {(line.price_id, line.kind) for line in lines} == {
        (price.pk, kind) for price in (v1, v2) for kind in ("input", "cached_input", "output")}
    by = {(line.price_id, line.kind): line for line in lines}
    assert by[(v1.pk, "input")].quantity == 900_000 and by[(v1.pk, "input")].unit_price_per_million == "3"
    assert by[(v1.pk, "input")].amount == Decimal("2.70")  # 0.9M x 2 USD x 1.5
    assert by[(v2.pk, "output")].amount == Decimal("2.70")  # 0.15M x 12 x 1.5
    assert "price from 2026-03-15" in by[(v2.pk, "output")].description
    assert invoice.total_cents == sum(line.amount_cents for line in lines)
    exact = Decimal(ledger_femtos(la_tenant, MARCH_LA)) / FEMTOS_PER_USD
    assert sum(Decimal(line.exact_usd) for line in lines) == exact == Decimal("12.375")
    # one line ends in half a cent: 0.3M cached x 1.5 USD x 1.5 = 0.675 -> 0.68 (half to even)
    assert by[(v2.pk, "cached_input")].exact_usd.rstrip("0") == "0.675"
    assert by[(v2.pk, "cached_input")].amount == Decimal("0.68") and invoice.total == Decimal("12.38")


@pytest.mark.django_db
def test_the_month_follows_the_tenants_zone(la_tenant, price_factory, record_write):
    price_factory()
    at(datetime(2026, 4, 1, 6, 59, tzinfo=UTC), record_write, la_tenant, request_id="march-la")
    at(datetime(2026, 4, 1, 7, 0, tzinfo=UTC), record_write, la_tenant, request_id="april-la")
    march = invoice_draft_refresh(tenant=la_tenant, period=MARCH_LA, now=datetime(2026, 4, 1, 7, 30, tzinfo=UTC))
    march_cost = UsageRecord.objects.get(request_id="march-la").cost_femtos
    assert march.period_start == datetime(2026, 3, 1, 8, tzinfo=UTC)
    assert sum(int(Decimal(line.exact_usd) * FEMTOS_PER_USD) for line in march.lines.all()) == march_cost


@pytest.mark.django_db
def test_finalized_after_the_grace_period_then_immutable_and_late_usage_is_a_credit_note(
        la_tenant, price_factory, record_write, settings):
    settings.INVOICE_GRACE_HOURS = 1
    price_factory()
    at(datetime(2026, 3, 10, tzinfo=UTC), record_write, la_tenant)
    assert invoices_close(period_label="2026-03", now=MARCH_LA.end + timedelta(minutes=59)).drafts
    with pytest.raises(ValueError, match="can be finalized from"):
        invoice_finalize(invoice=Invoice.objects.get(), now=MARCH_LA.end)
    result = invoices_close(period_label="2026-03", now=MARCH_LA.end + timedelta(hours=1))
    [invoice] = result.finalized
    assert invoice.is_final and invoice.finalized_at == MARCH_LA.end + timedelta(hours=1)
    frozen = (invoice.total_cents, list(invoice.lines.values_list("exact_usd", "amount_cents")))
    invoice.total_cents += 1
    with pytest.raises(ValueError, match="never changes"):
        invoice.save()
    with pytest.raises(ValueError, match="never change"):
        invoice.lines.first().save()

    # a finish recorded in the period after it closed (a slow worker), and an operator's credit
    at(datetime(2026, 3, 31, 23, tzinfo=UTC), record_write, la_tenant, completion_tokens=5_000_000)
    operator = get_user_model().objects.create_user("ops", password="a-long-test-password-1")
    adjustment_create(tenant=la_tenant, kind="credit", amount_usd="0.50", reason="latency SLO", operator=operator,
                      effective_at=datetime(2026, 3, 20, tzinfo=UTC))
    after = invoices_close(period_label="2026-03", now=MARCH_LA.end + timedelta(days=2))
    [note] = after.credit_notes
    invoice.refresh_from_db()
    assert (invoice.total_cents, list(invoice.lines.values_list("exact_usd", "amount_cents"))) == frozen
    assert note.kind == "credit_note" and note.corrects == invoice and note.is_final
    assert {line.kind for line in note.lines.all()} == {"input", "output", "adjustment"}
    assert note.total_cents == sum(note.lines.values_list("amount_cents", flat=True))
    assert billed_cents(invoice) == invoice.total_cents + note.total_cents
    assert invoices_close(period_label="2026-03", now=MARCH_LA.end + timedelta(days=3)).credit_notes == []


@pytest.mark.django_db
def test_totals_reconcile_with_the_ledger_on_random_usage(tenant_factory, tier_factory, price_factory, record_write):
    rng = random.Random(26)
    start = datetime(2026, 3, 1, tzinfo=UTC)
    prices = {model: [price_factory(model=model, input=str(Decimal(rng.randint(1, 9_999_999)).scaleb(-6)),
                                    cached=str(Decimal(rng.randint(0, 999_999)).scaleb(-6)),
                                    output=str(Decimal(rng.randint(1, 40_000_000)).scaleb(-6)),
                                    effective_from=start + timedelta(days=d)) for d in (0, 11, 23)]
              for model in ("a", "b", "c")}
    assert len(prices) == 3
    tenants = [tenant_factory(tier=tier_factory(price_multiplier=Decimal(rng.randint(1, 3000)).scaleb(-3)),
                              timezone=tz) for tz in ("UTC", LA, "Asia/Kolkata")]
    for _ in range(150):
        tenant = rng.choice(tenants)
        when = start + timedelta(seconds=rng.randint(0, 31 * 86400 - 1))
        prompt = rng.randint(0, 50_000)
        at(when, record_write, tenant, model=rng.choice("abc"), admitted_at=when - timedelta(seconds=rng.randint(0, 60)),
           prompt_tokens=prompt, cached_tokens=rng.randint(0, prompt), completion_tokens=rng.randint(0, 4000),
           finish_reason=rng.choice(["stop", "length", "abort", "error"]))
    for tenant in tenants:
        period = month_parse(label="2026-03", tz=tenant.timezone)
        invoice = invoice_draft_refresh(tenant=tenant, period=period, now=start + timedelta(days=40))
        lines = list(invoice.lines.all())
        assert invoice.total_cents == sum(line.amount_cents for line in lines)
        exact = sum(Decimal(line.exact_usd) for line in lines)
        assert exact * FEMTOS_PER_USD == ledger_femtos(tenant, period)  # nothing lost before rounding
        # each line rounds once, by at most half a cent
        assert abs(Decimal(invoice.total_cents) / 100 - exact) <= Decimal("0.005") * len(lines)


@pytest.mark.django_db
def test_invoices_close_command(la_tenant, price_factory, record_write, capsys):
    price_factory()
    at(datetime(2026, 3, 10, tzinfo=UTC), record_write, la_tenant)
    with time_machine.travel(datetime(2026, 4, 5, tzinfo=UTC), tick=False):
        call_command("invoices_close", "--period", "2026-03")
    assert "finalized: INV-" in capsys.readouterr().out
    assert Invoice.objects.get(tenant=la_tenant, period="2026-03").is_final


@pytest.mark.django_db
def test_the_beat_task_drafts_the_current_month(la_tenant, price_factory, record_write):
    from billing.tasks import close_invoices

    price_factory()
    at(datetime(2026, 3, 10, tzinfo=UTC), record_write, la_tenant)
    with time_machine.travel(datetime(2026, 3, 12, tzinfo=UTC), tick=False):
        close_invoices.apply()
    invoice = Invoice.objects.get(tenant=la_tenant)
    assert invoice.status == "draft" and invoice.period == "2026-03" and invoice.total_cents >= 0
    assert invoice.lines.exists()
