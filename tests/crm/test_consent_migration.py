"""Upgrading keeps only consent with a recorded basis: `crm/0012` turns the old default (consent
with no time, given to every customer the ERP sync or the admin created) into none, and keeps a
sign-up's consent (it has its time) as "legacy"."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

BEFORE = [("crm", "0011_inbox_retry_later")]
AFTER = [("crm", "0012_customer_consent_source")]


@pytest.mark.django_db(transaction=True)
def test_the_upgrade_keeps_recorded_consent_and_drops_the_old_default():
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    old = executor.loader.project_state(BEFORE).apps
    org = old.get_model("crm", "Organization").objects.create(name="Loja", slug="loja")
    Customer = old.get_model("crm", "Customer")
    imported = Customer.objects.create(organization=org, name="Importada", marketing_consent=True)
    signed_up = Customer.objects.create(
        organization=org, name="Cadastro", marketing_consent=True, consent_at=timezone.now()
    )
    refused = Customer.objects.create(organization=org, name="Recusou", marketing_consent=False)

    executor = MigrationExecutor(connection)
    executor.migrate(AFTER)
    new = executor.loader.project_state(AFTER).apps.get_model("crm", "Customer")
    rows = dict(new.objects.values_list("pk", "marketing_consent"))
    sources = dict(new.objects.values_list("pk", "marketing_consent_source"))
    assert (rows[imported.pk], sources[imported.pk]) == (False, "")
    assert (rows[signed_up.pk], sources[signed_up.pk]) == (True, "legacy")
    assert (rows[refused.pk], sources[refused.pk]) == (False, "")

    MigrationExecutor(connection).migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())
