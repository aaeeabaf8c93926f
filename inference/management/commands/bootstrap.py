"""Idempotent setup: default tiers, the SmolLM2 served-model row, a demo tenant, an admin user.

Prints a new demo API key every run (the only thing a second run adds).
"""

from django.conf import settings
from django.core.management.base import BaseCommand

from billing.services.prices import prices_bootstrap_defaults
from inference.bootstrap import platform_bootstrap


class Command(BaseCommand):
    help = "Create default tiers, the served model, a demo tenant and an admin user (idempotent); print a new demo key."

    def add_arguments(self, parser):
        parser.add_argument("--admin-username", default=settings.BOOTSTRAP_ADMIN_USERNAME)
        parser.add_argument("--admin-email", default="admin@example.com")
        parser.add_argument(
            "--admin-password",
            default=None,
            help="Password for a newly created admin user (default: $ADMIN_PASSWORD, else generated and printed).",
        )
        parser.add_argument("--base-url", default=settings.BASE_URL)

    def handle(self, *args, **options):
        password = options["admin_password"] or settings.BOOTSTRAP_ADMIN_PASSWORD
        result = platform_bootstrap(
            admin_username=options["admin_username"], admin_password=password, admin_email=options["admin_email"]
        )
        prices_bootstrap_defaults()
        base = options["base_url"].rstrip("/")
        write = self.stdout.write
        write("Created: " + (", ".join(result.created) if result.created else "nothing (already bootstrapped)"))
        write(f"Demo tenant: {result.demo_tenant.slug} (tier {result.demo_tenant.tier.name})")
        write(f"Demo API key (shown once): {result.demo_key.key}")
        owner = (f"password {result.owner_password}" if result.owner_password
                 else "(existing user, password unchanged)")
        write(f"Dashboard: {base}/dashboard/  user {result.owner_username}  {owner}")
        if result.admin_password is None:
            write(f"Admin: {base}/admin/  user {result.admin_username} (existing user, password unchanged)")
        elif password:
            write(f"Admin: {base}/admin/  user {result.admin_username}  password from --admin-password/ADMIN_PASSWORD")
        else:
            write(f"Admin: {base}/admin/  user {result.admin_username}  password {result.admin_password}")
        write(f"Try: curl {base}/v1/models -H 'Authorization: Bearer {result.demo_key.key}'")
