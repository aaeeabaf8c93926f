from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from billing.services.budgets import limits_set
from tenants.models import ApiKey, Tenant
from tenants.services.limits import LIMIT_OPTIONS, usd_to_micros


class Command(BaseCommand):
    help = ("Set a tenant's limits (overriding its tier's) or a key's own ceilings, then print the effective "
            "limits. 0 means no limit; --clear NAME falls back to the tier (tenant) or to the tenant's (key).")

    def add_arguments(self, parser):
        parser.add_argument("--tenant", required=True, help="tenant slug")
        parser.add_argument("--key", help="API key prefix (sk-...): set that key's own limits")
        parser.add_argument("--rpm", type=int, help="requests per minute")
        parser.add_argument("--tpm", type=int, help="tokens per minute (prompt + max_tokens at admission)")
        parser.add_argument("--max-concurrent", type=int, help="requests running at once")
        parser.add_argument("--monthly-token-quota", type=int, help="tokens per calendar month (tenant's zone)")
        parser.add_argument("--monthly-budget-usd", help="spend per calendar month, USD (e.g. 25 or 12.50)")
        parser.add_argument("--clear", nargs="+", default=[], choices=sorted(LIMIT_OPTIONS), metavar="NAME",
                            help=f"remove an override: {', '.join(LIMIT_OPTIONS)}")

    def handle(self, *args, **options):
        tenant = Tenant.objects.select_related("tier", "budget").filter(slug=options["tenant"]).first()
        if tenant is None:
            raise CommandError(f"No tenant {options['tenant']!r}.")
        api_key = None
        if options["key"]:
            api_key = ApiKey.objects.filter(tenant=tenant, prefix=options["key"]).first()
            if api_key is None:
                raise CommandError(f"No key {options['key']!r} on tenant {tenant.slug}.")
        values = {}
        for option, name in LIMIT_OPTIONS.items():
            value = options[option.replace("-", "_")]
            if value is not None:
                values[name] = value
        try:
            if "monthly_spend_limit_micros" in values:
                values["monthly_spend_limit_micros"] = usd_to_micros(values["monthly_spend_limit_micros"])
            rows = limits_set(tenant=tenant, api_key=api_key, values=values,
                              clear=[LIMIT_OPTIONS[name] for name in options["clear"]])
        except (ValueError, ValidationError) as exc:
            raise CommandError(str(exc)) from exc
        who = f"key {api_key.redacted} of {tenant.slug}" if api_key else f"tenant {tenant.slug} (tier {tenant.tier.name})"
        self.stdout.write(f"Limits of {who}:")
        for row in rows:
            shown = "none" if not row.effective else row.effective
            self.stdout.write(f"  {row.name:28} {shown!s:>14}  from {row.source}")
