from django.apps import AppConfig


class BillingConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "billing"

    def ready(self) -> None:
        from billing.models import femtos
        from billing.services import budgets
        from billing.services.price_cache import connect_signals

        connect_signals()
        budgets.connect()  # the verified-key rows carry the tenant's budget; its changes empty that cache
        femtos.connect_signals()  # SQLite's exact femto-dollar sums
