"""The demo organization's ERP connection, pointed at the Millennium sandbox with its login. Demo
data only: the composition root (project/) imports it, never a production module (the `demo`
import contract)."""

from __future__ import annotations

from crm.models import Organization
from erp.models import ErpConnection
from project.sandboxes.millennium_data import DEFAULT_PASSWORD, DEFAULT_USERNAME


def erp_connection_demo(*, organization: Organization, base_url: str) -> ErpConnection:
    """Point the organization's ERP at `base_url` (the sandbox, with its login). Safe to run twice."""
    connection = ErpConnection.objects.filter(organization=organization).first() or ErpConnection(
        organization=organization
    )
    connection.base_url = base_url
    connection.username = DEFAULT_USERNAME
    connection.set_password(DEFAULT_PASSWORD)
    connection.enabled = True
    connection.save()
    return connection
