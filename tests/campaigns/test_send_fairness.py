"""Send batches take turns between tenants: a batch gives its turn between chunks (crm.jobs.yield_turn)
when another tenant's work waits ahead of its tenant's next job (docs/fair-share.md)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from campaigns import lifecycle
from campaigns.models import Campaign, WhatsappMessage
from crm import fairshare, jobs, queues
from crm.models import Customer, Organization
from project.sandboxes.whatsapp import SandboxServer
from tests.campaigns.conftest import PHONE_NUMBER_ID, TOKEN, whatsapp_number

B_NUMBER_ID = "109876549999"
B_PREFIX = "+55219"  # tenant B's customers' phones; A's are +55119…


@pytest.fixture
def sandbox() -> Iterator[SandboxServer]:
    with SandboxServer(
        host="127.0.0.1", port=0, numbers={PHONE_NUMBER_ID: TOKEN, B_NUMBER_ID: TOKEN}
    ) as server:
        yield server


def _tenant_b(sandbox: SandboxServer, recipients: int) -> Campaign:
    org = Organization.objects.create(name="Outra Loja", slug="outra")
    number = whatsapp_number(org, sandbox, phone_number_id=B_NUMBER_ID, display="+5521940000000")
    Customer.objects.bulk_create(
        Customer(
            organization=org,
            marketing_consent=True,
            erp_id=f"B{i}",
            name=f"Cliente{i} Souza",
            phone=f"{B_PREFIX}{70000000 + i:08d}",
        )
        for i in range(recipients)
    )
    return Campaign.objects.create(
        organization=org,
        name="Natal",
        whatsapp_number=number,
        template_name="promo_bf",
        template_variables=["first_name"],
    )


def test_a_tenants_send_batch_gives_its_turn_to_another_tenants_batch_between_chunks(
    wa, sandbox, run_jobs, settings
):
    settings.WHATSAPP_BATCH_SIZE = 60
    settings.WHATSAPP_SEND_CHUNK = 10
    wa["customers"](120)  # tenant A: two batches of 60
    big = lifecycle.campaign_start(campaign=wa["campaign"]())
    small = lifecycle.campaign_start(campaign=_tenant_b(sandbox, 20))  # tenant B: one batch of 20
    run_jobs([queues.CAMPAIGN_TRIGGER])  # both fan out: A's batches and B's wait on whatsapp-send
    # Both tenants joined the queue at the same time: the first pick breaks the tie by the
    # tenant's id as text. The test wants A's batch first (it is running when B's work waits).
    a_first = str(big.organization_id) < str(small.organization_id)
    if not a_first:
        big, small = small, big
    assert len(fairshare.queued_ids(jobs.get_connection(), queues.WHATSAPP_SEND)) == 3
    run_jobs([queues.WHATSAPP_SEND])

    order = ["B" if m["to"].startswith(B_PREFIX.lstrip("+")) else "A" for m in sandbox.messages()]
    if not a_first:
        order = ["A" if t == "B" else "B" for t in order]
    assert order.count("A") == 120 and order.count("B") == 20  # each message sent exactly once
    b_last = max(i for i, t in enumerate(order) if t == "B")
    # A's first batch gave its turn after one chunk: B's batch came before the other 50 of it
    # (before this, after all 60, and a 200,000-recipient campaign's batch in full before B's).
    assert order[:b_last].count("A") == 10, order
    for campaign in (big, small):
        campaign.refresh_from_db()
        assert campaign.status == Campaign.Status.SENT
    assert set(WhatsappMessage.objects.values_list("status", flat=True)) == {"sent"}
    assert set(WhatsappMessage.objects.values_list("attempts", flat=True)) == {1}  # no attempt spent


def test_a_tenants_batch_alone_never_gives_its_turn(wa, sandbox, run_jobs, settings):
    settings.WHATSAPP_BATCH_SIZE = 60
    settings.WHATSAPP_SEND_CHUNK = 10
    wa["customers"](60)
    campaign = lifecycle.campaign_start(campaign=wa["campaign"]())
    run_jobs([queues.CAMPAIGN_TRIGGER])
    [job_id] = fairshare.queued_ids(jobs.get_connection(), queues.WHATSAPP_SEND)
    run_jobs([queues.WHATSAPP_SEND])
    campaign.refresh_from_db()
    assert campaign.status == Campaign.Status.SENT and len(sandbox.messages()) == 60
    job = jobs.fetch_job(job_id)
    assert job is None or "yields" not in job.meta
