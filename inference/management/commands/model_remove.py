"""python manage.py model_remove NAME [--disable]

Deletes the served model NAME's row (its usage records and prices keep the name); `--disable` keeps the
row and only disables it (as `model_add NAME --disabled`). Either way the API answers 404 for it within
seconds (inference.api.model_access's cache) and its workers can be stopped.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from inference.model_sources import SourceError
from inference.served_models import served_model_add, served_model_remove


class Command(BaseCommand):
    help = "Remove (or with --disable, disable) a served model."

    def add_arguments(self, parser) -> None:
        parser.add_argument("name")
        parser.add_argument("--disable", action="store_true", help="keep the row, disabled")

    def handle(self, *args, **options) -> None:
        name = options["name"]
        if options["disable"]:
            try:
                served_model_add(name=name, enabled=False)
            except SourceError as exc:
                raise CommandError(str(exc)) from exc
            self.stdout.write(f"Disabled {name}.")
            return
        if not served_model_remove(name=name):
            raise CommandError(f"There is no served model {name!r}.")
        self.stdout.write(f"Removed {name}.")
