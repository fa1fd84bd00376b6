"""Inbound WhatsApp replies mixed into the Meta webhook burst (used by webhook_intake.py
--replies-share): each reply is one signed POST of a `messages` webhook from a customer of the
benchmark's organization to its number; one in ten is "PARAR". Measured: the replies stored once,
webhook accepted -> incoming message in the Chatwoot sandbox (in-process, at --chatwoot-latency-ms)
p50/p95/p99, and webhook accepted -> customer opted out p99."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from typing import Any

from django.db import connection as conn

from benchmarks.runner_common import percentile
from crm.models import Customer, Organization
from integrations import outbound
from integrations.models import ChatwootAccount, WhatsappNumber
from messaging.models import ConversationMessage, ConversationSettings
from project.sandboxes.chatwoot import ChatwootSandbox

PHONE_NUMBER_ID = "1"
CW_TOKEN = "bench-chatwoot-token-0123456789"  # noqa: S105 - the sandbox's


def setup(org: Organization, chatwoot_url: str) -> None:
    """The organization's number (phone number id "1", the statuses' too) and its Chatwoot."""
    number, _ = WhatsappNumber.objects.update_or_create(
        phone_number_id=PHONE_NUMBER_ID,
        defaults={"organization": org, "display_phone_number": "+5511940000000"},
    )
    org.campaigns.update(whatsapp_number=number)
    # No confirmation is sent: the number points at no Graph API here.
    ConversationSettings.objects.update_or_create(
        organization=org, defaults={"opt_out_confirmation": "", "resume_confirmation": ""}
    )
    outbound.trust_origin(chatwoot_url)
    ChatwootAccount.objects.filter(organization=org).delete()
    account = ChatwootAccount(organization=org, base_url=chatwoot_url, account_id=1, inbox_id=1)
    account.set_api_token(CW_TOKEN)
    account.save()


def start(org: Organization, share: float, latency_ms: float) -> ChatwootSandbox | None:
    """The Chatwoot sandbox, started, and the organization pointed at it (None without replies)."""
    if share <= 0:
        return None
    cw = ChatwootSandbox(accounts={1: CW_TOKEN}, inboxes={1: 1}, latency_ms=latency_ms)
    cw.start()
    setup(org, cw.url)
    return cw


def stop(cw: ChatwootSandbox | None) -> None:
    if cw is not None:
        cw.stop()


def summary(r: dict[str, Any] | None, share: float, latency_ms: float) -> str:
    """The replies' line of the report (empty without replies)."""
    if not r:
        return ""
    return (
        f"\n  of which replies ({share:.0%}): {r['replies']:,} accepted, stored once: "
        f"{r['stored_once']} ({r['stored']:,} rows); accepted -> in Chatwoot (sandbox at "
        f"{latency_ms:.0f} ms) p50 {r['chatwoot_p50'] * 1000:.0f} ms "
        f"p95 {r['chatwoot_p95'] * 1000:.0f} ms p99 {r['chatwoot_p99'] * 1000:.0f} ms; "
        f"PARAR accepted -> opted out p99 {r['opt_out_p99'] * 1000:.0f} ms ({r['opt_outs']} opt-outs)"
    )


def reply_request(app_secret: str, phone: str, i: int, ts: int) -> tuple[str, bytes, dict[str, str]]:
    text = "PARAR" if i % 10 == 0 else f"reply {i}"
    message: dict[str, Any] = {"from": phone.lstrip("+"), "id": f"wamid.REPLY{i}", "timestamp": str(ts)}
    message.update({"type": "text", "text": {"body": text}})
    value = {
        "messaging_product": "whatsapp",
        "metadata": {"phone_number_id": PHONE_NUMBER_ID},
        "contacts": [{"wa_id": phone.lstrip("+"), "profile": {"name": "Bench"}}],
        "messages": [message],
    }
    body = json.dumps(
        {
            "object": "whatsapp_business_account",
            "entry": [{"id": "1", "changes": [{"field": "messages", "value": value}]}],
        }
    ).encode()
    signature = "sha256=" + hmac.new(app_secret.encode(), body, hashlib.sha256).hexdigest()
    return "/webhooks/whatsapp/", body, {"Content-Type": "application/json", "X-Hub-Signature-256": signature}


class ReplyPoller(threading.Thread):
    """When each accepted reply is first seen in Chatwoot (its text, polled every 50 ms in the
    sandbox) and each PARAR's customer first seen opted out (polled in the database)."""

    def __init__(self, cw: ChatwootSandbox) -> None:
        super().__init__(daemon=True)
        self.cw = cw
        self.accepted: dict[str, float] = {}  # text -> accepted at (time.time())
        self.opt_outs: dict[str, float] = {}  # phone -> accepted at
        self.in_chatwoot: dict[str, float] = {}
        self.opted: dict[str, float] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                now = time.time()
                texts = {m["content"] for m in self.cw.messages()}
                with self.lock:
                    for text in texts & set(self.accepted) - set(self.in_chatwoot):
                        self.in_chatwoot[text] = now - self.accepted[text]
                    phones = [p for p in self.opt_outs if p not in self.opted]
                if phones:
                    done = Customer.objects.filter(phone__in=phones, whatsapp_opted_out_at__isnull=False)
                    with self.lock:
                        for phone in done.values_list("phone", flat=True):
                            self.opted.setdefault(phone, now - self.opt_outs[phone])
                time.sleep(0.05)
        finally:
            conn.close()


def figures(poller: ReplyPoller, org: Organization, accepted: int) -> dict[str, Any]:
    lags = list(poller.in_chatwoot.values())
    stored = ConversationMessage.objects.filter(organization=org, direction="in").count()
    return {
        "replies": accepted,
        "stored_once": stored == accepted,
        "stored": stored,
        "chatwoot_p50": percentile(lags, 50),
        "chatwoot_p95": percentile(lags, 95),
        "chatwoot_p99": percentile(lags, 99),
        "opt_outs": len(poller.opted),
        "opt_out_p99": percentile(list(poller.opted.values()), 99),
    }
