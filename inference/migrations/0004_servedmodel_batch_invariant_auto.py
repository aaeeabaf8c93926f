"""ServedModel.batch_invariant becomes yes / no / unknown (the engine's default: on where it costs little).

Rows that held False held it because False was the only default: they become unknown, so they follow the
engine's default (issue 40); rows an operator turned on stay on.
"""

from django.db import migrations, models


def false_to_auto(apps, schema_editor):
    apps.get_model("inference", "ServedModel").objects.filter(batch_invariant=False).update(batch_invariant=None)


def auto_to_false(apps, schema_editor):
    apps.get_model("inference", "ServedModel").objects.filter(batch_invariant=None).update(batch_invariant=False)


class Migration(migrations.Migration):

    dependencies = [
        ("inference", "0003_servedmodel_chat_template_dtype"),
    ]

    operations = [
        migrations.AlterField(
            model_name="servedmodel",
            name="batch_invariant",
            field=models.BooleanField(null=True, default=None, help_text="Workers serve this model in batch-invariant mode: a seeded request gives the same tokens whatever "
                                                                         "else runs beside it. Unknown (the default): on where it costs little (a bf16 Q4 model on a CPU "
                                                                         "without 16-bit GEMM hardware), off elsewhere (CUDA, CPUs with bf16 GEMM: BENCHMARKS.md). Applies "
                                                                         "when a worker (re)starts; responses' system_fingerprint changes with it."),
        ),
        migrations.RunPython(false_to_auto, auto_to_false),
    ]
