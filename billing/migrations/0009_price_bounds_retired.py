"""Prices: bounded by billing.money.price_check (MAX_PRICE_PER_MILLION) in the model's clean() rather than a
field validator, and retired (`retired_at`, `retired_by`) instead of deleted or rewritten."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


def _price_field(label: str):
    return models.DecimalField(decimal_places=6, max_digits=12, help_text=(
        f"USD per 1M {label} tokens: 0 to 10000, up to 6 decimal places"))


class Migration(migrations.Migration):

    dependencies = [
        ("billing", "0008_money_femtos_numeric"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name="price",
            name="retired_at",
            field=models.DateTimeField(blank=True, editable=False, null=True,
                                       help_text="When an operator retired this version; it prices nothing since"),
        ),
        migrations.AddField(
            model_name="price",
            name="retired_by",
            field=models.ForeignKey(blank=True, editable=False, null=True, on_delete=django.db.models.deletion.SET_NULL,
                                    related_name="+", to=settings.AUTH_USER_MODEL),
        ),
        migrations.AlterField(model_name="price", name="input_per_million", field=_price_field("uncached input")),
        migrations.AlterField(model_name="price", name="cached_input_per_million",
                              field=_price_field("cached input (prefix-cache hits)")),
        migrations.AlterField(model_name="price", name="output_per_million", field=_price_field("output")),
    ]
