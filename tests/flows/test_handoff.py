"""A flow's `handoff` step hands the customer to a person: a private note naming the flow on the
contact's conversation in the organization's Chatwoot inbox, the conversation opened and assigned,
through the Chatwoot push (waiting while Chatwoot is down); without Chatwoot, a note on the
customer's page."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from flows.models import Enrollment, EnrollmentStep
from integrations.models import ChatwootAccount
from messaging import chatwoot_inbound
from messaging.models import ConversationMessage
from project.sandboxes.chatwoot import ChatwootSandbox

ACCOUNT_ID = 7
INBOX_ID = 3
TOKEN = "cw-sandbox-api-access-token-0123456789"
HANDOFF = {
    "key": "vip-handoff",
    "name": "Cliente VIP",
    "trigger": {"type": "sale"},
    "reentry": "always",
    "steps": [{"type": "handoff", "note": "Ligar hoje", "assignee_id": 12, "team_id": 4}],
}


@pytest.fixture
def cw() -> Iterator[ChatwootSandbox]:
    with ChatwootSandbox(accounts={ACCOUNT_ID: TOKEN}, inboxes={INBOX_ID: ACCOUNT_ID}) as server:
        yield server


def _chatwoot(org, cw: ChatwootSandbox) -> ChatwootAccount:
    account = ChatwootAccount(organization=org, base_url=cw.url, account_id=ACCOUNT_ID, inbox_id=INBOX_ID)
    account.set_api_token(TOKEN)
    account.save()
    return account


def test_a_handoff_opens_and_assigns_the_contacts_chatwoot_conversation_with_a_private_note(
    wa, make_flow, sell, run_jobs, cw
):
    _chatwoot(wa["org"], cw)
    make_flow(HANDOFF)
    ana, bia = wa["customers"](2)
    cw.fail_next(1, status=503)  # Chatwoot down at first: the handoff waits, then lands
    sell(ana)
    run_jobs(["flows", "chatwoot-inbound"], settle=0)
    assert chatwoot_inbound.waiting() == {wa["org"].pk: 1} and not cw.messages()
    assert chatwoot_inbound.push(organization_id=wa["org"].pk) == 1

    (note,) = cw.messages()
    assert note["private"] is True and note["phone"] == ana.phone
    assert "Cliente VIP" in note["content"] and "Ligar hoje" in note["content"]
    (conversation,) = cw.conversations()
    assert conversation["inbox_id"] == INBOX_ID and conversation["status"] == "open"
    assert conversation["meta"]["assignee"] == {"id": 12} and conversation["meta"]["team"] == {"id": 4}
    step = EnrollmentStep.objects.get(enrollment__customer=ana)
    assert step.type == "handoff" and step.outcome == "done" and "Chatwoot" in step.detail
    assert chatwoot_inbound.waiting() == {}
    # Done once: the same job again hands nobody over twice.
    run_jobs(["flows", "chatwoot-inbound"], settle=0)
    assert len(cw.messages()) == 1 and not ConversationMessage.objects.filter(customer=bia).exists()


def test_without_chatwoot_the_handoff_is_a_note_on_the_customers_page(
    wa, make_flow, sell, run_jobs, admin_client, english
):
    make_flow(HANDOFF)
    (ana,) = wa["customers"](1)
    sell(ana)
    run_jobs(["flows"], settle=0)
    row = ConversationMessage.objects.get(customer=ana)
    assert (row.kind, row.source, row.status, row.chatwoot_pending) == ("handoff", "flow", "note", False)
    assert Enrollment.objects.get(customer=ana).status == "completed"
    page = admin_client.get(f"/admin/crm/customer/{ana.pk}/change/").content.decode()
    assert "Cliente VIP" in page and "Ligar hoje" in page and "note for the agents" in page
