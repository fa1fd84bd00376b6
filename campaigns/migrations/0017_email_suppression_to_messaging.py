# The email suppression list moves to messaging with its table (messaging 0001): state only.

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("campaigns", "0016_campaign_audience_days_range_email_subject_single_line"),
        ("messaging", "0001_email_suppression"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name="EmailSuppression")],
            database_operations=[],
        ),
    ]
