"""Invoices get a random public id (`inv_...`) for URLs and the API: existing rows get one each, then the column
is unique (as tenants 0005 did for API keys)."""

import secrets
import string

from django.db import migrations, models

import billing.models.invoices

_ALPHABET = string.ascii_letters + string.digits


def fill_public_ids(apps, schema_editor):
    Invoice = apps.get_model("billing", "Invoice")
    for invoice in Invoice.objects.filter(public_id__isnull=True).only("pk").iterator():
        public_id = "inv_" + "".join(secrets.choice(_ALPHABET) for _ in range(20))
        Invoice.objects.filter(pk=invoice.pk).update(public_id=public_id)


class Migration(migrations.Migration):

    dependencies = [
        ("billing", "0009_price_bounds_retired"),
    ]

    operations = [
        migrations.AddField(
            model_name="invoice",
            name="public_id",
            field=models.CharField(max_length=32, null=True, editable=False),
        ),
        migrations.RunPython(fill_public_ids, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="invoice",
            name="public_id",
            field=models.CharField(default=billing.models.invoices.invoice_public_id_new, editable=False,
                                   help_text="The invoice's id in URLs and the API", max_length=32, unique=True),
        ),
    ]
