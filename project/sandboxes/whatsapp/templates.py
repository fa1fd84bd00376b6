"""The message templates the WhatsApp sandbox serves (`GET /{version}/{waba-id}/message_templates`),
shaped as Meta answers them: a realistic set with an image and a text header, body variables, URL
(static and dynamic) and quick-reply buttons, and one REJECTED and one PAUSED template."""

from __future__ import annotations

import base64
from typing import Any

PROMO_DEMO: dict[str, Any] = {
    "name": "promo_demo",
    "language": "pt_BR",
    "status": "APPROVED",
    "category": "MARKETING",
    "id": "1001",
    "components": [
        {"type": "HEADER", "format": "IMAGE", "example": {"header_handle": ["https://example.com/h.jpg"]}},
        {
            "type": "BODY",
            "text": "Olá {{1}}! A {{2}} preparou ofertas de até 40% só para você esta semana.",
            "example": {"body_text": [["Maria", "Loja Centro"]]},
        },
        {"type": "FOOTER", "text": "Responda SAIR para não receber mais"},
        {
            "type": "BUTTONS",
            "buttons": [
                {
                    "type": "URL",
                    "text": "Ver ofertas",
                    "url": "https://crm.example.com/{{1}}",
                    "example": ["r/x"],
                },
                {"type": "QUICK_REPLY", "text": "Não tenho interesse"},
            ],
        },
    ],
}

TEMPLATES: list[dict[str, Any]] = [
    PROMO_DEMO,
    {
        "name": "aniversario",
        "language": "pt_BR",
        "status": "APPROVED",
        "category": "MARKETING",
        "id": "1002",
        "components": [
            {"type": "HEADER", "format": "TEXT", "text": "Feliz aniversário!"},
            {"type": "BODY", "text": "{{1}}, seu presente está na {{2}}: 15% de desconto até domingo."},
            {
                "type": "BUTTONS",
                "buttons": [
                    {"type": "URL", "text": "Resgatar", "url": "https://crm.example.com/{{1}}"},
                    {"type": "URL", "text": "Sair da lista", "url": "https://crm.example.com/{{1}}"},
                ],
            },
        ],
    },
    {
        "name": "novidades",
        "language": "pt_BR",
        "status": "APPROVED",
        "category": "MARKETING",
        "id": "1003",
        "components": [
            {"type": "BODY", "text": "Chegou coleção nova! Passe na loja e confira."},
            {
                "type": "BUTTONS",
                "buttons": [
                    {"type": "URL", "text": "Catálogo", "url": "https://loja.example.com/catalogo"},
                    {"type": "QUICK_REPLY", "text": "Quero saber mais"},
                    {"type": "QUICK_REPLY", "text": "Parar promoções"},
                ],
            },
        ],
    },
    {
        "name": "pedido_enviado",
        "language": "pt_BR",
        "status": "APPROVED",
        "category": "UTILITY",
        "id": "1004",
        "components": [{"type": "BODY", "text": "Oi {{1}}, seu pedido saiu para entrega."}],
    },
    {
        "name": "promo_demo",
        "language": "en_US",
        "status": "APPROVED",
        "category": "MARKETING",
        "id": "1005",
        "components": [{"type": "BODY", "text": "Hi {{1}}! {{2}} has deals up to 40% off this week."}],
    },
    {
        "name": "black_friday",
        "language": "pt_BR",
        "status": "REJECTED",
        "category": "MARKETING",
        "id": "1006",
        "rejected_reason": "PROMOTIONAL",
        "components": [{"type": "BODY", "text": "GANHE DINHEIRO FÁCIL {{1}}!!!"}],
    },
    {
        "name": "reativacao",
        "language": "pt_BR",
        "status": "PAUSED",
        "category": "MARKETING",
        "id": "1007",
        "components": [{"type": "BODY", "text": "{{1}}, sentimos sua falta! Volte e ganhe frete grátis."}],
    },
]


def _cursor(offset: int) -> str:
    return base64.urlsafe_b64encode(f"o:{offset}".encode()).decode()


def _offset(cursor: str) -> int | None:
    try:
        kind, _, value = base64.urlsafe_b64decode(cursor.encode()).decode().partition(":")
        return int(value) if kind == "o" and int(value) >= 0 else None
    except (ValueError, UnicodeDecodeError):
        return None


def templates_page(*, url: str, limit: str, after: str, fields: str) -> dict[str, Any] | None:
    """One page as Meta answers it (`paging.next` only when a page follows), or None for a cursor
    that is not ours. `fields` narrows each template to those keys, as Graph does."""
    size = int(limit) if limit.isdigit() and 0 < int(limit) <= 1000 else 25
    start = _offset(after) if after else 0
    if start is None:
        return None
    wanted = [f.strip() for f in fields.split(",") if f.strip()]
    rows = [
        {k: v for k, v in t.items() if not wanted or k in wanted} for t in TEMPLATES[start : start + size]
    ]
    paging: dict[str, Any] = {"cursors": {"before": _cursor(start), "after": _cursor(start + len(rows))}}
    if start + size < len(TEMPLATES):
        paging["next"] = f"{url}?limit={size}&after={paging['cursors']['after']}"
    return {"data": rows, "paging": paging}
