"""`manage.py create_user --tenant SLUG --role owner|member|viewer --username U [--email E] [--password P]`."""

import secrets

from django.core.management.base import BaseCommand, CommandError

from common.errors import ApiError
from tenants.models import Membership
from tenants.selectors import tenant_get
from tenants.services.tenants import user_create_member


class Command(BaseCommand):
    help = "Create a dashboard user who is a member of a tenant (owner, member or viewer)."

    def add_arguments(self, parser):
        parser.add_argument("--tenant", required=True, help="the tenant's slug")
        parser.add_argument("--role", required=True, choices=Membership.Role.values)
        parser.add_argument("--username", required=True)
        parser.add_argument("--email", default="")
        parser.add_argument("--password", default=None, help="default: generated and printed once")

    def handle(self, *args, **options):
        tenant = tenant_get(slug=options["tenant"])
        if tenant is None:
            raise CommandError(f"Unknown tenant {options['tenant']!r}.")
        password = options["password"] or secrets.token_urlsafe(12)
        try:
            user = user_create_member(tenant=tenant, username=options["username"], role=options["role"],
                                      email=options["email"], password=password)
        except ApiError as exc:
            raise CommandError(exc.message) from exc
        shown = "from --password" if options["password"] else password
        self.stdout.write(f"Created user {user.username} ({options['role']} of {tenant.slug}); password {shown}")
