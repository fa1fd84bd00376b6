"""Inbound WhatsApp replies mixed into the Meta webhook burst (used by webhook_intake.py
--replies-share): each reply is one signed POST of a `messages` webhook from a customer of the
benchmark's organization to its number; one in ten is "PARAR". Measured: the replies stored once,
webhook accepted -> incoming message in the Chatwoot sandbox (`manage.py chatwoot_sandbox` in a
process of its own, as Chatwoot runs on machines of its own, at --chatwoot-latency-ms; the time is
the sandbox's own receipt of the message) p50/p95/p99, and webhook accepted -> customer opted out
p99."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from django.db import connection as conn

from benchmarks.runner_common import percentile
from crm.models import Customer, Organization
from integrations import outbound
from integrations.models import ChatwootAccount, WhatsappNumber
from messaging.models import ConversationMessage, ConversationSettings

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


class SandboxProcess:
    """The Chatwoot sandbox in a process of its own (`manage.py chatwoot_sandbox --port 0`): it no
    longer shares this process's interpreter lock with the load generator's client threads, which
    delayed its answers (and so the latency measured) as much as the push did."""

    def __init__(self, latency_ms: float) -> None:
        root = Path(__file__).resolve().parent.parent
        (root / "var").mkdir(exist_ok=True)
        # Its output to a file: a pipe nobody reads would fill up and block it.
        self.log = root / "var" / "bench-chatwoot.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    str(root / "manage.py"),
                    "chatwoot_sandbox",
                    "--port",
                    "0",
                    "--token",
                    CW_TOKEN,
                    "--latency-ms",
                    str(latency_ms),
                ],
                cwd=root,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 60  # a hang guard
        found = None
        while found is None and self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
            found = re.search(r"https?://[^\s()]+", self.log.read_text(errors="replace"))
        if found is None:
            self.stop()
            raise SystemExit(f"the Chatwoot sandbox did not start: {self.log.read_text(errors='replace')!r}")
        self.url = found.group(0)
        self._http = httpx.Client(base_url=self.url, timeout=60)
        self._last = 0

    def new_messages(self) -> list[dict[str, Any]]:
        """The messages stored since the last call, in order (each with the sandbox's received_at)."""
        body = self._http.get("/_sandbox/messages", params={"after": self._last}).json()
        messages: list[dict[str, Any]] = body["messages"]
        if messages:
            self._last = messages[-1]["id"]
        return messages

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def start(org: Organization, share: float, latency_ms: float) -> SandboxProcess | None:
    """The Chatwoot sandbox, started, and the organization pointed at it (None without replies)."""
    if share <= 0:
        return None
    cw = SandboxProcess(latency_ms)
    setup(org, cw.url)
    return cw


def stop(cw: SandboxProcess | None) -> None:
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
    """When each accepted reply first reached Chatwoot (its text; the sandbox's receipt time, read
    every 50 ms) and each PARAR's customer was first seen opted out (polled in the database)."""

    def __init__(self, cw: SandboxProcess) -> None:
        super().__init__(daemon=True)
        self.cw = cw
        self.accepted: dict[str, float] = {}  # text -> accepted at (time.time())
        self.opt_outs: dict[str, float] = {}  # phone -> accepted at
        self.received: dict[str, float] = {}  # text -> first in the sandbox at (its time.time())
        self.opted: dict[str, float] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()

    @property
    def in_chatwoot(self) -> dict[str, float]:
        """text -> seconds from accepted to in Chatwoot, for the accepted texts seen there."""
        with self.lock:
            return {
                text: max(self.received[text] - at, 0.0)
                for text, at in self.accepted.items()
                if text in self.received
            }

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                now = time.time()
                new = self.cw.new_messages()
                with self.lock:
                    for message in new:
                        self.received.setdefault(message["content"], message["received_at"])
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
