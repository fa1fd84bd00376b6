# The message tables are written while this runs (atomic = False): indexes are built and dropped
# CONCURRENTLY, and a unique constraint is built as a unique index CONCURRENTLY then attached to
# the table (ADD CONSTRAINT ... USING INDEX, no scan). Dropping the foreign-key constraints takes a
# brief lock and reads nothing.

import django.db.models.deletion
import django.db.models.functions.text
from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models

import campaigns.models

# (model, column, new constraint, partial): the unique=True columns becoming UniqueConstraints.
UNIQUE = [
    ("whatsappmessage", "token", "wamsg_token_unique", False),
    ("whatsappmessage", "wamid", "wamsg_wamid_unique", True),
    ("emailmessage", "token", "emmsg_token_unique", False),
    ("emailmessage", "esp_message_id", "emmsg_esp_message_id_unique", True),
]
MODELS = ("whatsappmessage", "emailmessage")


def _table(apps, model):
    return apps.get_model("campaigns", model)._meta.db_table


def _on(schema_editor, table, column):
    """{name: info} of the constraints and indexes on exactly this one column."""
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        found = connection.introspection.get_constraints(cursor, table)
    return {name: info for name, info in found.items() if info["columns"] == [column]}


def unique_constraints(apps, schema_editor):
    q = schema_editor.quote_name
    for model, column, name, partial in UNIQUE:
        table = _table(apps, model)
        old = _on(schema_editor, table, column)
        where = f" WHERE {q(column)} IS NOT NULL" if partial else ""
        schema_editor.execute(
            f"CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS {q(name)} ON {q(table)} ({q(column)}){where}"
        )
        if not partial:  # as Django makes a UniqueConstraint without a condition: a table constraint
            schema_editor.execute(
                f"ALTER TABLE {q(table)} ADD CONSTRAINT {q(name)} UNIQUE USING INDEX {q(name)}"
            )
        for old_name, info in old.items():
            if old_name == name:
                continue
            if info["unique"] and not info["index"]:  # the column's UNIQUE
                schema_editor.execute(f"ALTER TABLE {q(table)} DROP CONSTRAINT IF EXISTS {q(old_name)}")
            else:  # its *_like index
                schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {q(old_name)}")


def unique_columns(apps, schema_editor):
    q = schema_editor.quote_name
    for model, column, name, partial in UNIQUE:
        table = _table(apps, model)
        like = schema_editor._create_index_name(table, [column], suffix="_like")
        schema_editor.execute(
            f"ALTER TABLE {q(table)} ADD CONSTRAINT {q(f'{table}_{column}_key')} UNIQUE ({q(column)})"
        )
        pattern = f"{q(column)} varchar_pattern_ops"
        schema_editor.execute(f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {q(like)} ON {q(table)} ({pattern})")
        if partial:
            schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {q(name)}")
        else:
            schema_editor.execute(f"ALTER TABLE {q(table)} DROP CONSTRAINT IF EXISTS {q(name)}")


def drop_customer_index(apps, schema_editor):
    q = schema_editor.quote_name
    for model in MODELS:
        table = _table(apps, model)
        for name, info in _on(schema_editor, table, "customer_id").items():
            if info["index"] and not info["unique"] and not info["primary_key"]:
                schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {q(name)}")


def create_customer_index(apps, schema_editor):
    q = schema_editor.quote_name
    for model in MODELS:
        table = _table(apps, model)
        name = schema_editor._create_index_name(table, ["customer_id"])
        schema_editor.execute(
            f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {q(name)} ON {q(table)} (customer_id)"
        )


def _foreign_keys(*, customer_index: bool) -> list[migrations.AlterField]:
    """The message tables' foreign keys without their database constraint; the customer's keeps
    its index when `customer_index` (to drop it CONCURRENTLY after)."""
    targets = [
        ("campaign", "campaigns.campaign"),
        ("customer", "crm.customer"),
        ("organization", "crm.organization"),
    ]
    related = {"whatsappmessage": "whatsapp_messages", "emailmessage": "email_messages"}
    return [
        migrations.AlterField(
            model_name=model,
            name=name,
            field=models.ForeignKey(
                db_constraint=False,
                db_index=customer_index and name == "customer",
                on_delete=django.db.models.deletion.CASCADE,
                related_name="+" if name == "organization" else related[model],
                to=to,
                verbose_name=name,
            ),
        )
        for model in ("emailmessage", "whatsappmessage")
        for name, to in targets
    ]


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("campaigns", "0010_whatsapp_outcome_unknown"),
        ("crm", "0005_customer_sale_erp_fields"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="emailmessage",
            index=models.Index(fields=["customer", "sent_at"], name="emmsg_customer_sent"),
        ),
        AddIndexConcurrently(
            model_name="emailmessage",
            index=models.Index(
                condition=models.Q(("status", "sending")), fields=["sending_at"], name="emmsg_sending"
            ),
        ),
        AddIndexConcurrently(
            model_name="emailmessage",
            index=models.Index(
                condition=models.Q(("sent_at__isnull", False)),
                fields=["campaign", "sent_at"],
                name="emmsg_campaign_sent_at",
            ),
        ),
        AddIndexConcurrently(
            model_name="whatsappmessage",
            index=models.Index(fields=["customer", "sent_at"], name="wamsg_customer_sent"),
        ),
        AddIndexConcurrently(
            model_name="whatsappmessage",
            index=models.Index(
                condition=models.Q(("status", "sending")), fields=["sending_at"], name="wamsg_sending"
            ),
        ),
        AddIndexConcurrently(
            model_name="whatsappmessage",
            index=models.Index(
                condition=models.Q(("sent_at__isnull", False)),
                fields=["campaign", "sent_at"],
                name="wamsg_campaign_sent_at",
            ),
        ),
        AddIndexConcurrently(
            model_name="emailmessage",
            index=models.Index(
                condition=models.Q(("status", "queued"), _negated=True),
                fields=["status", "id"],
                name="emmsg_status_id_done",
            ),
        ),
        AddIndexConcurrently(
            model_name="emailmessage",
            index=models.Index(
                django.db.models.functions.text.Upper("email"),
                condition=models.Q(("email", ""), _negated=True),
                name="emmsg_email_upper_known",
            ),
        ),
        AddIndexConcurrently(
            model_name="whatsappmessage",
            index=models.Index(
                condition=models.Q(("status", "queued"), _negated=True),
                fields=["status", "id"],
                name="wamsg_status_id_done",
            ),
        ),
        AddIndexConcurrently(
            model_name="whatsappmessage",
            index=models.Index(
                condition=models.Q(("phone", ""), _negated=True),
                fields=["phone"],
                name="wamsg_phone_prefix_known",
                opclasses=["varchar_pattern_ops"],
            ),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="emailmessage",
                    name="esp_message_id",
                    field=models.CharField(
                        blank=True, max_length=255, null=True, verbose_name="provider message id"
                    ),
                ),
                migrations.AlterField(
                    model_name="emailmessage",
                    name="token",
                    field=models.CharField(
                        default=campaigns.models._token, max_length=32, verbose_name="link token"
                    ),
                ),
                migrations.AlterField(
                    model_name="whatsappmessage",
                    name="token",
                    field=models.CharField(
                        default=campaigns.models._token, max_length=32, verbose_name="link token"
                    ),
                ),
                migrations.AlterField(
                    model_name="whatsappmessage",
                    name="wamid",
                    field=models.CharField(
                        blank=True, max_length=128, null=True, verbose_name="Meta message id"
                    ),
                ),
                migrations.AddConstraint(
                    model_name="emailmessage",
                    constraint=models.UniqueConstraint(fields=("token",), name="emmsg_token_unique"),
                ),
                migrations.AddConstraint(
                    model_name="emailmessage",
                    constraint=models.UniqueConstraint(
                        condition=models.Q(("esp_message_id__isnull", False)),
                        fields=("esp_message_id",),
                        name="emmsg_esp_message_id_unique",
                    ),
                ),
                migrations.AddConstraint(
                    model_name="whatsappmessage",
                    constraint=models.UniqueConstraint(fields=("token",), name="wamsg_token_unique"),
                ),
                migrations.AddConstraint(
                    model_name="whatsappmessage",
                    constraint=models.UniqueConstraint(
                        condition=models.Q(("wamid__isnull", False)),
                        fields=("wamid",),
                        name="wamsg_wamid_unique",
                    ),
                ),
            ],
            database_operations=[migrations.RunPython(unique_constraints, unique_columns)],
        ),
        # The foreign keys lose their constraint (AlterField drops it) and the customer's own index
        # (dropped CONCURRENTLY here: wamsg_customer_sent leads with the customer).
        migrations.SeparateDatabaseAndState(
            state_operations=_foreign_keys(customer_index=False),
            database_operations=[
                *_foreign_keys(customer_index=True),
                migrations.RunPython(drop_customer_index, create_customer_index),
            ],
        ),
        RemoveIndexConcurrently(
            model_name="emailmessage",
            name="emmsg_org_customer_sent",
        ),
        RemoveIndexConcurrently(
            model_name="emailmessage",
            name="emmsg_in_flight",
        ),
        RemoveIndexConcurrently(
            model_name="emailmessage",
            name="emmsg_campaign_sent",
        ),
        RemoveIndexConcurrently(
            model_name="whatsappmessage",
            name="wamsg_org_customer_sent",
        ),
        RemoveIndexConcurrently(
            model_name="whatsappmessage",
            name="wamsg_in_flight",
        ),
        RemoveIndexConcurrently(
            model_name="whatsappmessage",
            name="wamsg_campaign_sent",
        ),
        RemoveIndexConcurrently(
            model_name="emailmessage",
            name="emmsg_status_id",
        ),
        RemoveIndexConcurrently(
            model_name="emailmessage",
            name="emmsg_email_upper",
        ),
        RemoveIndexConcurrently(
            model_name="whatsappmessage",
            name="wamsg_status_id",
        ),
        RemoveIndexConcurrently(
            model_name="whatsappmessage",
            name="wamsg_phone_prefix",
        ),
    ]
