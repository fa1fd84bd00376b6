"""The date trigger's daily pass reads the customers born on one day: an index on the birthday."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("flows", "0001_flows_initial"), ("crm", "0014_customer_birth_date")]

    operations = [
        migrations.RunSQL(
            "CREATE INDEX IF NOT EXISTS flows_customer_birthday ON crm_customer "
            "(organization_id, (EXTRACT(MONTH FROM birth_date)), (EXTRACT(DAY FROM birth_date)), id) "
            "WHERE birth_date IS NOT NULL",
            "DROP INDEX IF EXISTS flows_customer_birthday",
        ),
    ]
