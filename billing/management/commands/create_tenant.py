from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from billing.services.budgets import operator_budget_set
from common.errors import ApiError
from tenants.selectors import tier_get
from tenants.services.tenants import tenant_create


class Command(BaseCommand):
    help = "Create a tenant on a tier (and the operator's monthly budget cap: --spend-limit-usd)."

    def add_arguments(self, parser):
        parser.add_argument("--slug", required=True)
        parser.add_argument("--name", default="")
        parser.add_argument("--tier", default="free")
        parser.add_argument("--spend-limit-usd", type=int, default=0, help="Monthly spend limit in whole USD; 0 = none")

    def handle(self, *args, **options):
        tier = tier_get(name=options["tier"])
        if tier is None:
            raise CommandError(f"Unknown tier {options['tier']!r} (run `manage.py bootstrap` for the defaults).")
        if options["spend_limit_usd"] < 0:
            raise CommandError("The spend limit cannot be negative.")
        try:
            with transaction.atomic():
                tenant = tenant_create(slug=options["slug"], name=options["name"] or options["slug"], tier=tier)
                if options["spend_limit_usd"]:
                    operator_budget_set(tenant=tenant, micros=options["spend_limit_usd"] * 1_000_000)
        except ApiError as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(f"Created tenant {tenant.slug} (id {tenant.pk}, tier {tier.name})")
