"""The issue's "done when", end to end with real processes: a reply typed into the Meta sandbox
(`sandbox_inbound`) reaches the production web server, a worker pool stores it, "PARAR" opts the
customer out, and every message reaches the Chatwoot sandbox in order per conversation — though the
worker pool is SIGKILLed midway and Chatwoot answers 503 for a while."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.core.management import call_command

from crm import recovery
from crm.models import Customer, OptOutSource
from integrations.models import ChatwootAccount
from messaging.models import ConversationMessage
from project.sandboxes.chatwoot import ChatwootSandbox
from tests.campaigns.conftest import PHONE_NUMBER_ID
from tests.conftest import wait_for

CW_TOKEN = "cw-sandbox-api-access-token-0123456789"


@pytest.mark.slow
def test_sandbox_replies_reach_the_page_and_chatwoot_in_order_through_a_kill_9_and_an_outage(
    wa, sandbox, web_server, worker_process
):
    assert settings.WHATSAPP_APP_SECRET, "the web server and this test share .env's WHATSAPP_APP_SECRET"
    sandbox.configure(webhook_url=f"{web_server}/webhooks/whatsapp/", app_secret=settings.WHATSAPP_APP_SECRET)
    with ChatwootSandbox(accounts={1: CW_TOKEN}, inboxes={1: 1}, latency_ms=20) as cw:
        account = ChatwootAccount(organization=wa["org"], base_url=cw.url, account_id=1, inbox_id=1)
        account.set_api_token(CW_TOKEN)
        account.save()
        people = wa["customers"](3)
        phones = [p.phone for p in people]

        def say(i: int, phone: str, text: str) -> None:
            # Without --sandbox-url: the business number's own Graph URL (the sandbox), as after
            # `make run --meta-port P`.
            call_command("sandbox_inbound", phone, text, phone_number_id=PHONE_NUMBER_ID)

        workers = worker_process("--processes", "2")
        n = 30
        for i in range(n // 2):
            say(i, phones[i % 3], f"mensagem {i}")
        wait_for(lambda: cw.messages(), timeout=120, what="the first message in Chatwoot")
        workers.kill()  # SIGKILL mid-work
        cw.fail_next(5, status=503)  # and Chatwoot down for a while
        for i in range(n // 2, n):
            say(i, phones[i % 3], f"mensagem {i}")
        say(n, phones[0], "PARAR")
        worker_process("--processes", "2")

        def delivered() -> bool:
            recovery.recover()  # the scheduler's every-minute pass
            contents = {m["content"] for m in cw.messages() if m["message_type"] == 0}
            return {f"mensagem {i}" for i in range(n)} | {"PARAR"} <= contents

        wait_for(delivered, timeout=240, interval=2, what="every inbound message in Chatwoot")
        inbound = ConversationMessage.objects.filter(direction="in")
        assert inbound.count() == n + 1  # each stored once
        assert not inbound.filter(chatwoot_pending=True).exists()
        # In order per conversation: each contact's first copies come in the order written.
        for phone in phones:
            seen: list[str] = []
            for m in cw.messages():
                if m["phone"] == phone and m["message_type"] == 0 and m["content"] not in seen:
                    seen.append(m["content"])
            written = [f"mensagem {i}" for i in range(n) if phones[i % 3] == phone]
            assert [c for c in seen if c in written] == written
        opted = Customer.objects.get(pk=people[0].pk)
        assert opted.whatsapp_opt_out_source == OptOutSource.KEYWORD
        wait_for(
            lambda: any(m["template"].get("type") == "text" for m in sandbox.messages()),
            timeout=120,
            what="the opt-out confirmation sent",
        )
