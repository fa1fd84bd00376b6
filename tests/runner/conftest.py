from __future__ import annotations

from collections.abc import Iterator

import pytest

from crm import jobs
from crm.models import Organization
from project.sandboxes.runner import HandlerSandbox
from runner.models import Handler, IntegrationType


@pytest.fixture
def org(transactional_db) -> Organization:
    return Organization.objects.create(name="Loja Runner", slug="runner-org")


@pytest.fixture
def fast(settings) -> None:
    """Short backoffs and waits, so retries and deferrals happen within a burst worker's settle."""
    settings.RUNNER_RETRY_BACKOFF = 0.2
    settings.RUNNER_PAUSE_DEFER = 0.3
    settings.RUNNER_TENANT_DEFER = 0.3


@pytest.fixture
def integration(transactional_db) -> IntegrationType:
    return IntegrationType.objects.create(integration_key="crm-x", name="CRM X")


@pytest.fixture
def py_handler(integration, org) -> Handler:
    return Handler.objects.create(
        integration=integration,
        handler_key="leads",
        direction="inbound",
        kind=Handler.Kind.PYTHON,
        callable_path="tests.runner.handlers",
        organization=org,
    )


@pytest.fixture
def sandbox() -> Iterator[HandlerSandbox]:
    with HandlerSandbox() as server:
        yield server


@pytest.fixture
def http_handler(integration, org, sandbox) -> Handler:
    return Handler.objects.create(
        integration=integration,
        handler_key="push",
        direction="outbound",
        kind=Handler.Kind.HTTP,
        endpoint_url=sandbox.url,
        organization=org,
    )


def processed() -> list[str]:
    raw = jobs.get_connection().lrange("crm:test:processed", 0, -1)
    return [v.decode() if isinstance(v, bytes) else v for v in raw]
