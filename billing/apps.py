from django.apps import AppConfig


class BillingConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "billing"

    def ready(self) -> None:
        from billing.models import femtos
        from billing.services.price_cache import connect_signals

        connect_signals()
        femtos.connect_signals()  # SQLite's exact femto-dollar sums
