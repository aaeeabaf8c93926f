"""`manage.py price_set --model M --input X --cached-input Y --output Z [--batch-discount PCT]
[--effective-from ISO-8601]`."""

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.utils.dateparse import parse_datetime

from billing.models.prices import PRICE_FIELDS
from billing.money import DEFAULT_BATCH_DISCOUNT_PERCENT
from billing.services.prices import price_create


class Command(BaseCommand):
    help = "Add a price version for a served model (USD per 1M tokens); versions are never edited."

    def add_arguments(self, parser):
        parser.add_argument("--model", required=True)
        parser.add_argument("--input", required=True, help="USD per 1M uncached input tokens")
        parser.add_argument("--cached-input", required=True, help="USD per 1M cached input tokens")
        parser.add_argument("--output", required=True, help="USD per 1M output tokens")
        parser.add_argument("--batch-discount", default=str(DEFAULT_BATCH_DISCOUNT_PERCENT), metavar="PCT",
                            help="Batch API lines pay every kind of token this whole percent less "
                                 f"(0 to 100, default {DEFAULT_BATCH_DISCOUNT_PERCENT})")
        parser.add_argument("--effective-from", default=None,
                            help="ISO-8601 with an offset (default: as soon as every process sees it)")
        parser.add_argument("--note", default="")

    def handle(self, *args, **options):
        effective_from = None
        if options["effective_from"]:
            effective_from = parse_datetime(options["effective_from"].replace("Z", "+00:00"))
            if effective_from is None:
                raise CommandError(f"--effective-from: not an ISO-8601 time: {options['effective_from']!r}")
        try:
            price = price_create(
                model=options["model"], input_per_million=options["input"],
                cached_input_per_million=options["cached_input"], output_per_million=options["output"],
                batch_discount_percent=options["batch_discount"], effective_from=effective_from, note=options["note"],
            )
        except ValidationError as exc:
            raise CommandError("; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items())) from exc
        self.stdout.write(
            f"Price #{price.pk} for {price.model} from {price.effective_from.isoformat()}: "
            f"input {price.input_per_million}, cached input {price.cached_input_per_million}, "
            f"output {price.output_per_million} USD per 1M tokens; batch ({price.batch_discount_percent}% off): "
            + ", ".join(format(price.batch_price_per_million(name).normalize(), "f") for name in PRICE_FIELDS)
        )
