"""The demo organization's integration: the online shop's sign-ups become its customers.

An in-process handler (`Handler.callable_path = "runner.demo"`), created by `manage.py demo`
(`integration_demo`) and run on the production paths: a manual run
(`manage.py runner_run demo-shop signups --org demo`) produces the shop's latest sign-ups, one item
each; a webhook (`POST /hooks/demo-shop/signups`, bearer token) delivers one. Either way each item
creates or fills in the customer with that email (its result says which); a sign-up without a
valid email or with an impossible phone fails for good (the DLQ).

Demo code: the composition root (project/) imports it, and the runner loads it by its
callable_path; never a production module (the `demo` import contract)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import phonenumbers

from crm import services
from integrations.errors import IntegrationError
from integrations.millennium.client import mobile_e164, normalize_email
from integrations.runner.contract import ItemIn, RunIn
from runner.models import Handler, IntegrationType

INTEGRATION_KEY = "demo-shop"
HANDLER_KEY = "signups"
SIGNUPS = 20  # sign-ups a manual run produces (the same ones every time: a re-run updates nothing)
# The body of the webhook `manage.py demo` prints (its `id` labels the item).
EXAMPLE_SIGNUP = {
    "id": "web-0001",
    "name": "Ana Souza",
    "email": "ana.souza@example.com.br",
    "phone": "(11) 98765-4321",
    "marketing_consent": True,
}

_PEOPLE = [
    ("Beatriz", "Carvalho"),
    ("Caio", "Mendes"),
    ("Daniela", "Rocha"),
    ("Eduardo", "Martins"),
    ("Fernanda", "Barros"),
    ("Gustavo", "Ribeiro"),
    ("Helena", "Teixeira"),
    ("Igor", "Moreira"),
    ("Juliana", "Cardoso"),
    ("Leonardo", "Nunes"),
]
# Demo phone numbers, also the demo organization's customers' (project/demo/crm.py).
_DDD = ["11", "21", "31", "41", "47", "51", "61", "71", "81", "85", "91", "62"]


def demo_phone(i: int) -> str:
    """A valid Brazilian mobile number in E.164, deterministic in i (+55 DD 9 9XXX XXXX)."""
    number = f"+55{_DDD[i % len(_DDD)]}99{(i * 7919) % 10_000_000:07d}"
    parsed = phonenumbers.parse(number)
    assert phonenumbers.is_valid_number(parsed), number
    return phonenumbers.format_number(parsed, phonenumbers.PhoneNumberFormat.E164)


def signup(i: int) -> dict[str, Any]:
    """The shop's i-th sign-up, as its form posts it (a national phone number, a consent box)."""
    first, last = _PEOPLE[i % len(_PEOPLE)]
    suffix = "" if i < len(_PEOPLE) else f".{i // len(_PEOPLE) + 1}"
    phone = phonenumbers.parse(demo_phone(10_000 + i))
    return {
        "name": f"{first} {last}",
        "email": f"{first.lower()}.{last.lower()}{suffix}@example.com.br",
        "phone": phonenumbers.format_number(phone, phonenumbers.PhoneNumberFormat.NATIONAL),
        "marketing_consent": i % 3 != 2,
    }


def produce(run: RunIn) -> Iterator[dict[str, Any]]:
    for i in range(SIGNUPS):
        yield {"external_id": f"signup-{i + 1:03d}", "payload": signup(i)}


def process(item: ItemIn) -> dict[str, Any]:
    """Create or fill in the customer of the sign-up; returns its id and what was done."""
    payload = item.payload if isinstance(item.payload, dict) else {}
    email = normalize_email(payload.get("email"))
    if not email:
        raise IntegrationError(f"no valid email in the sign-up: {payload.get('email')!r}", retryable=False)
    raw_phone = str(payload.get("phone") or "")
    phone = mobile_e164(None, raw_phone) if raw_phone else ""
    if raw_phone and not phone:
        raise IntegrationError(f"not a Brazilian mobile number: {raw_phone!r}", retryable=False)
    customer_id, action = services.customer_signup(
        organization_id=item.organization_id,
        email=email,
        name=str(payload.get("name") or "").strip()[:200],
        phone=phone,
        marketing_consent=payload.get("marketing_consent") is True,
    )
    return {"customer_id": customer_id, "customer": action}


def integration_demo(*, organization_id: int) -> tuple[Handler, str]:
    """The demo organization's integration (this module: the online shop's sign-ups become
    customers), in-process, started by hand or by webhook (bearer token). Returns the handler and
    its webhook token, generated the first time and kept after. Safe to run twice: a second run
    writes nothing unless someone changed the handler (then its demo settings are put back; paused
    and the limits stay as the operator left them)."""
    integration, _ = IntegrationType.objects.get_or_create(
        integration_key=INTEGRATION_KEY, defaults={"name": "Loja online (demo)"}
    )
    if not integration.enabled:
        integration.enabled = True
        integration.save(update_fields=["enabled"])
    wanted = {
        "direction": "inbound",
        "kind": Handler.Kind.PYTHON,
        "callable_path": "runner.demo",
        "organization_id": organization_id,
        "webhook_auth": Handler.WebhookAuth.TOKEN,
    }
    handler = Handler.objects.filter(integration=integration, handler_key=HANDLER_KEY).first()
    if handler is None:
        handler = Handler(integration=integration, handler_key=HANDLER_KEY, **wanted)
        handler.set_webhook_secret("demo-" + secrets.token_urlsafe(18))
        handler.save()
        return handler, handler.webhook_secret()
    changed = [field for field, value in wanted.items() if getattr(handler, field) != value]
    for field in changed:
        setattr(handler, field, wanted[field])
    if not handler.webhook_secret_encrypted:
        handler.set_webhook_secret("demo-" + secrets.token_urlsafe(18))
        changed.append("webhook_secret_encrypted")
    if changed:
        handler.save(update_fields=changed)  # post_save invalidates the runner's cache
    return handler, handler.webhook_secret()
