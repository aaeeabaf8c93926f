from django.apps import AppConfig


class TenantsConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "tenants"

    def ready(self) -> None:
        from tenants import checks  # noqa: F401  (registers the deploy checks)
        from tenants.services.api_key_cache import connect_signals

        connect_signals()
