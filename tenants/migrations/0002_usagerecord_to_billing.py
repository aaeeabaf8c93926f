"""UsageRecord moved to the billing app: dropped from this app's state only.

The table `tenants_usagerecord` and its rows stay; billing's 0001 takes the
model over (SeparateDatabaseAndState on both sides, no SQL runs).
"""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("tenants", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name="UsageRecord")],
            database_operations=[],
        ),
    ]
