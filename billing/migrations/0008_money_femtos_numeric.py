"""Femto-dollar amounts in columns that cannot overflow: NUMERIC(38, 0) on PostgreSQL, decimal text on SQLite
(billing.models.femtos; they were 64-bit integers, 9,223 USD at most).

On PostgreSQL each table is rewritten once, all its money columns in one ALTER TABLE (an AlterField per
column would rewrite tenants_usagerecord four times); SQLite rebuilds the tables as Django does for any
column change, converting the stored integers to their text.
"""

import django.core.validators
from django.db import migrations

import billing.models.femtos

# model -> (field name, help text, default) of each money column
MONEY = {
    "usagerecord": [("input_cost_femtos", "Uncached prompt tokens, femto-USD", 0),
                    ("cached_input_cost_femtos", "Cached prompt tokens, femto-USD", 0),
                    ("output_cost_femtos", "Completion tokens, femto-USD", 0),
                    ("cost_femtos", "Total, femto-USD (1e-15 USD)", 0)],
    "hourlyusage": [(name, "", 0) for name in ("cached_input_cost_femtos", "cost_femtos", "input_cost_femtos",
                                               "output_cost_femtos")],
    "dailyusage": [(name, "", 0) for name in ("cached_input_cost_femtos", "cost_femtos", "input_cost_femtos",
                                              "output_cost_femtos")],
    "adjustment": [("amount_femtos", "Positive, femto-USD", None)],
}


def _new_field(name: str, help_text: str, default):
    extra = {"default": default} if default is not None else {
        "validators": [django.core.validators.MinValueValidator(1)]}
    return billing.models.femtos.FemtosField(help_text=help_text, **extra)


def _alter(apps, schema_editor, *, to_numeric: bool):
    """`apps` is the state before this migration (both ways: the database operation changes no state)."""
    quote = schema_editor.quote_name
    for model_name, fields in MONEY.items():
        model = apps.get_model("billing", model_name)
        if schema_editor.connection.vendor == "postgresql":
            target = "numeric(38,0)" if to_numeric else "bigint"
            columns = [model._meta.get_field(name).column for name, _, _ in fields]
            schema_editor.execute(f"ALTER TABLE {quote(model._meta.db_table)} " + ", ".join(
                f"ALTER COLUMN {quote(column)} TYPE {target} USING {quote(column)}::{target}" for column in columns))
        elif to_numeric:  # SQLite: one rebuild of the table with all its new columns
            changes = []
            for name, help_text, default in fields:
                new = _new_field(name, help_text, default)
                new.set_attributes_from_name(name)
                new.model = model
                changes.append((model._meta.get_field(name), new))
            schema_editor._remake_table(model, alter_fields=changes)
        else:  # SQLite, back: the table as the earlier state declares it (the texts become integers again)
            schema_editor._remake_table(model)


def forwards(apps, schema_editor):
    _alter(apps, schema_editor, to_numeric=True)


def backwards(apps, schema_editor):
    _alter(apps, schema_editor, to_numeric=False)


class Migration(migrations.Migration):

    dependencies = [
        ("billing", "0007_daily_latency"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(forwards, backwards)],
            state_operations=[
                migrations.AlterField(model_name=model_name, name=name, field=_new_field(name, help_text, default))
                for model_name, fields in MONEY.items() for name, help_text, default in fields
            ],
        ),
    ]
