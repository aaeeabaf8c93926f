import json
from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from common.errors import ApiError
from tenants.selectors import tenant_get
from tenants.services.api_keys import api_key_create


class Command(BaseCommand):
    help = "Create an API key for a tenant and print it (the only time it is shown)."

    def add_arguments(self, parser):
        parser.add_argument("--tenant", required=True, help="tenant slug")
        parser.add_argument("--name", required=True)
        parser.add_argument("--scopes", default="", help="comma-separated; empty = all scopes")
        parser.add_argument("--expires-days", type=int, default=None)
        parser.add_argument("--json", action="store_true", help='print {"key": ..., "tenant": ..., "id": ...}')

    def handle(self, *args, **options):
        tenant = tenant_get(slug=options["tenant"])
        if tenant is None:
            raise CommandError(f"Unknown tenant {options['tenant']!r}.")
        scopes = [scope.strip() for scope in options["scopes"].split(",") if scope.strip()]
        expires_at = None
        if options["expires_days"] is not None:
            expires_at = timezone.now() + timedelta(days=options["expires_days"])
        try:
            new = api_key_create(tenant=tenant, name=options["name"], scopes=scopes, expires_at=expires_at)
        except ApiError as exc:
            raise CommandError(exc.message) from exc
        if options["json"]:
            self.stdout.write(json.dumps({"key": new.key, "tenant": tenant.slug, "id": new.api_key.public_id}))
        else:
            self.stdout.write(f"API key for {tenant.slug} (id {new.api_key.public_id}; shown once, store it now):")
            self.stdout.write(new.key)
