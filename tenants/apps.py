"""The tenants app: on ready, its deploy checks and the hooks that tell every web process of a key change."""

from django.apps import AppConfig


class TenantsConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "tenants"

    def ready(self) -> None:
        from tenants import checks  # noqa: F401  (registers the deploy checks)
        from tenants.services import key_events

        # every save and delete of an ApiKey, Tenant or Tier empties the verified-key cache, here and in
        # the other web processes
        key_events.connect()
