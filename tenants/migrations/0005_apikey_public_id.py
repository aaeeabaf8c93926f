"""API keys get a random public id (`key_...`): existing rows get one each, then the column is unique."""

import secrets
import string

from django.db import migrations, models

import tenants.models

_ALPHABET = string.ascii_letters + string.digits


def fill_public_ids(apps, schema_editor):
    ApiKey = apps.get_model("tenants", "ApiKey")
    for api_key in ApiKey.objects.filter(public_id__isnull=True).only("pk").iterator():
        public_id = "key_" + "".join(secrets.choice(_ALPHABET) for _ in range(20))
        ApiKey.objects.filter(pk=api_key.pk).update(public_id=public_id)


class Migration(migrations.Migration):

    dependencies = [
        ("tenants", "0004_limit_overrides"),
    ]

    operations = [
        migrations.AddField(
            model_name="apikey",
            name="public_id",
            field=models.CharField(max_length=32, null=True, editable=False),
        ),
        migrations.RunPython(fill_public_ids, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="apikey",
            name="public_id",
            field=models.CharField(default=tenants.models.api_key_public_id_new, editable=False, max_length=32,
                                   unique=True),
        ),
    ]
