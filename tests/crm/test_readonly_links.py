"""A read-only relation on a change page links to its object only for a reader who may open it
(crm/admin_links.py): a link that answers 403 is not shown."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse

from crm.models import Membership, Organization
from runner.models import Execution, Handler, IntegrationType

pytestmark = pytest.mark.django_db

User = get_user_model()


@pytest.fixture
def org() -> Organization:
    return Organization.objects.create(name="Loja Leitura", slug="loja-leitura")


@pytest.fixture
def handler(org: Organization) -> Handler:
    integration = IntegrationType.objects.create(integration_key="erp-x", name="ERP X")
    return Handler.objects.create(
        integration=integration, handler_key="pull", direction="inbound", organization=org
    )


@pytest.fixture
def execution(org: Organization, handler: Handler) -> Execution:
    """A page whose every field is read-only, for everyone (relations to all three models)."""
    return Execution.objects.create(
        organization=org,
        integration=handler.integration,
        handler=handler,
        direction="inbound",
        trigger="manual",
    )


def _client(user) -> Client:
    client = Client()
    client.force_login(User.objects.get(pk=user.pk))  # axes: force_login, no authenticate
    return client


def _link(url: str) -> str:
    return f'<a href="{url}">'


def test_a_manager_reads_a_platform_relation_as_text_and_their_own_objects_as_links(handler, execution):
    manager = User.objects.create_user("gerente", password="pw-gerente-1234")
    Membership.objects.create(user=manager, organization=handler.organization, role="manager")
    client = _client(manager)
    integration_url = reverse("admin:runner_integrationtype_change", args=[handler.integration_id])
    assert client.get(integration_url).status_code == 403  # where a link would have led

    # The handler's page: its integration type is read-only for a manager (operator_fields).
    page = client.get(reverse("admin:runner_handler_change", args=[handler.pk])).content.decode()
    assert integration_url not in page
    assert '<div class="readonly">erp-x</div>' in page  # named, as text
    assert _link(reverse("admin:crm_organization_change", args=[handler.organization_id])) in page

    page = client.get(reverse("admin:runner_execution_change", args=[execution.pk])).content.decode()
    assert integration_url not in page
    assert '<div class="readonly">erp-x</div>' in page
    assert _link(reverse("admin:runner_handler_change", args=[handler.pk])) in page


def test_a_superuser_follows_every_read_only_relation(handler, execution):
    client = _client(User.objects.create_superuser("raiz", password="pw-raiz-1234"))

    page = client.get(reverse("admin:runner_execution_change", args=[execution.pk])).content.decode()

    assert _link(reverse("admin:runner_integrationtype_change", args=[handler.integration_id])) in page
    assert _link(reverse("admin:runner_handler_change", args=[handler.pk])) in page
    assert _link(reverse("admin:crm_organization_change", args=[handler.organization_id])) in page
