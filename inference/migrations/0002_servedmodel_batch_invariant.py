from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("inference", "0001_initial"),
    ]

    operations = [
        migrations.AddField(
            model_name="servedmodel",
            name="batch_invariant",
            field=models.BooleanField(
                default=False,
                help_text="Workers serve this model in batch-invariant mode: a seeded request gives the same tokens "
                          "whatever else runs beside it, at a throughput cost (BENCHMARKS.md). Applies when a worker "
                          "(re)starts; responses' system_fingerprint changes with it."),
        ),
    ]
