from django.core.management.base import BaseCommand, CommandError

from tenants.selectors import api_key_find
from tenants.services.api_keys import api_key_revoke


class Command(BaseCommand):
    help = "Revoke an API key by id or prefix (sk-xxxxxxxxxx); it stops working at once."

    def add_arguments(self, parser):
        parser.add_argument("key", nargs="?", help="key id, prefix, or the full key")
        parser.add_argument("--id", dest="key_id", type=int, default=None)
        parser.add_argument("--prefix", default=None)

    def handle(self, *args, **options):
        given = [str(v) for v in (options["key"], options["key_id"], options["prefix"]) if v is not None]
        if len(given) != 1:
            raise CommandError("Give exactly one of: KEY, --id ID, --prefix PREFIX.")
        api_key = api_key_find(reference=given[0])
        if api_key is None:
            raise CommandError(f"No API key matches {given[0]!r}.")
        already = api_key.revoked_at is not None
        api_key = api_key_revoke(api_key=api_key)
        state = "was already revoked" if already else "revoked"
        when = f"{api_key.revoked_at:%Y-%m-%d %H:%M:%S}Z"
        self.stdout.write(f"Key {api_key.public_id} {api_key.redacted} of {api_key.tenant.slug} {state} at {when}")
