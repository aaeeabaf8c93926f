"""`manage.py invoices_close --period YYYY-MM`: by hand, what the beat task does."""

from django.core.management.base import BaseCommand, CommandError

from billing.services.invoices import invoices_close


class Command(BaseCommand):
    help = ("Draft, finalize (after the period end plus INVOICE_GRACE_HOURS) or credit-note every tenant's "
            "invoice for a month, in each tenant's time zone.")

    def add_arguments(self, parser):
        parser.add_argument("--period", default=None, help="YYYY-MM (default: the current and the previous month)")

    def handle(self, *args, **options):
        try:
            result = invoices_close(period_label=options["period"])
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        for label, invoices in (("draft", result.drafts), ("finalized", result.finalized),
                                ("credit note", result.credit_notes)):
            for invoice in invoices:
                self.stdout.write(f"{label}: {invoice.number} {invoice.total} {invoice.currency.upper()}")
        if not (result.drafts or result.finalized or result.credit_notes):
            self.stdout.write("nothing to do")
