"""The demo organization's three flows: post-purchase thanks, birthday, win-back (60 days)."""

from __future__ import annotations

from typing import Any

from crm.models import Organization
from flows import services
from flows.models import Flow

DEMO_FLOWS: list[dict[str, Any]] = [
    {
        "key": "thanks-after-sale",
        "name": "Obrigado pela compra",
        "trigger": {"type": "sale", "min_total": "100.00"},
        "reentry": {"once_per_days": 30},
        "transactional": True,
        "steps": [
            {"type": "wait", "minutes": 0},
            {
                "type": "send_whatsapp",
                "template": "obrigado_compra",
                "language": "pt_BR",
                "variables": ["first_name", "store_name"],
            },
            {"type": "wait", "days": 3, "at": "10:00"},
            {"type": "condition", "if": "purchased_since_entry", "then": "exit"},
            {
                "type": "send_email",
                "subject": "{{ first_name }}, o que achou da compra?",
                "body": "<mjml><mj-body><mj-section><mj-column><mj-text>Obrigado, {{ first_name }}!"
                "</mj-text></mj-column></mj-section></mj-body></mjml>",
                "body_format": "mjml",
            },
        ],
    },
    {
        "key": "birthday",
        "name": "Feliz aniversário",
        "trigger": {"type": "date", "field": "birth_date", "offset_days": 0, "at": "00:00"},
        "reentry": {"once_per_days": 300},
        "steps": [{"type": "send_whatsapp", "template": "feliz_aniversario", "variables": ["first_name"]}],
    },
    {
        "key": "win-back-60",
        "name": "Sentimos sua falta",
        "trigger": {"type": "no_purchase", "days": 60, "at": "09:00"},
        "reentry": {"once_per_days": 60},
        "exit_on": ["sale"],
        "steps": [
            {"type": "send_whatsapp", "template": "sentimos_sua_falta", "variables": ["first_name"]},
            {"type": "wait", "days": 7, "at": "10:00"},
            {"type": "condition", "if": "purchased_since_entry", "then": "exit"},
            {"type": "send_whatsapp", "template": "cupom_volta", "variables": ["first_name"]},
        ],
    },
]


def flows_demo(*, organization: Organization) -> list[Flow]:
    """Create (or update, by key) the demo flows of `organization`. Safe to run again."""
    return [services.flow_import(data=data, organization_slug=organization.slug)[0] for data in DEMO_FLOWS]
