# The email suppression list moves from campaigns to messaging with its table: state only.

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("campaigns", "0016_campaign_audience_days_range_email_subject_single_line"),
        ("crm", "0014_customer_birth_date"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="EmailSuppression",
                    fields=[
                        ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                        ("email", models.EmailField(max_length=254, verbose_name="address")),
                        (
                            "reason",
                            models.CharField(
                                choices=[
                                    ("hard_bounce", "hard bounce"),
                                    ("complaint", "spam complaint"),
                                    ("manual", "added by an operator"),
                                ],
                                max_length=20,
                                verbose_name="reason",
                            ),
                        ),
                        ("detail", models.TextField(blank=True, default="", verbose_name="detail")),
                        (
                            "created_at",
                            models.DateTimeField(
                                default=django.utils.timezone.now, editable=False, verbose_name="created at"
                            ),
                        ),
                        (
                            "organization",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="email_suppressions",
                                to="crm.organization",
                                verbose_name="organization",
                            ),
                        ),
                    ],
                    options={
                        "verbose_name": "email suppression",
                        "verbose_name_plural": "email suppressions",
                        "db_table": "campaigns_emailsuppression",
                        "constraints": [
                            models.UniqueConstraint(fields=("organization", "email"), name="email_suppression_unique")
                        ],
                    },
                ),
            ],
            database_operations=[],
        ),
    ]
