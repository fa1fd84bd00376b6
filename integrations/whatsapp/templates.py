"""A WhatsApp Business account's message templates from the Graph API: plain values in and out.

`GET /{version}/{waba-id}/message_templates?fields=…&limit=…&after=…` answers
`{"data": [template, …], "paging": {"cursors": {"after": "…"}, "next": "…"}}`; each template is
`{"id", "name", "language", "status", "category", "components": [...]}` with components
`{"type": "HEADER", "format": "TEXT"|"IMAGE"|…, "text"}`, `{"type": "BODY", "text": "Oi {{1}}"}`,
`{"type": "FOOTER", "text"}` and `{"type": "BUTTONS", "buttons": [{"type": "URL", "text", "url"},
{"type": "QUICK_REPLY", "text"}, …]}` (Cloud API reference, WhatsApp Business Account > Message
Templates). `parse_template` reads one defensively (whatever Meta or a proxy sends, a template it
cannot read is skipped, never an exception); `fetch_templates` follows the `after` cursor (never a
`next` URL as given: every page goes to the configured Graph URL).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from integrations import http
from integrations.errors import IntegrationError

FIELDS = "id,name,language,status,category,components"
PAGE_SIZE = 100
MAX_PAGES = 200  # 20,000 templates: Meta allows far fewer per account; a cursor loop stops here
STATUSES = frozenset({"APPROVED", "PENDING", "REJECTED", "PAUSED", "DISABLED", "IN_APPEAL", "DELETED"})
# Positional ({{1}}) variables; a named one ({{first_name}}) cannot be filled by our sends.
POSITIONAL_RE = re.compile(r"\{\{\s*(\d{1,3})\s*\}\}")
NAMED_RE = re.compile(r"\{\{\s*([a-z_][a-z0-9_]*)\s*\}\}")
NAME_MAX, TEXT_MAX = 512, 4096


@dataclass(frozen=True)
class Button:
    index: int
    type: str  # URL, QUICK_REPLY, PHONE_NUMBER, COPY_CODE…
    text: str
    url: str = ""

    @property
    def dynamic(self) -> bool:
        """A URL button whose URL ends in a variable (the message fills it)."""
        return self.type == "URL" and bool(POSITIONAL_RE.search(self.url))


@dataclass(frozen=True)
class Template:
    meta_id: str
    name: str
    language: str
    status: str
    category: str
    header_format: str = ""  # TEXT, IMAGE, VIDEO, DOCUMENT, LOCATION or ""
    header_text: str = ""
    body: str = ""
    footer: str = ""
    buttons: tuple[Button, ...] = ()
    components: list[dict[str, Any]] = field(default_factory=list, compare=False)

    @property
    def variables(self) -> list[int]:
        """The body's positional variables, each once, in order: [1, 2] for "{{1}} … {{2}} … {{1}}"."""
        return sorted({int(n) for n in POSITIONAL_RE.findall(self.body)})

    @property
    def sendable_reason(self) -> str:
        """Why a campaign cannot send this template as our sends fill it, or "": variables must be
        {{1}}…{{n}} in the body only (no named one, none in a text header)."""
        if NAMED_RE.search(self.body) or NAMED_RE.search(self.header_text):
            return "named variables are not supported"
        if POSITIONAL_RE.search(self.header_text):
            return "a variable in the header is not supported"
        if self.variables != list(range(1, len(self.variables) + 1)):
            return "body variables are not numbered 1…n"
        return ""


def _text(value: object, limit: int = TEXT_MAX) -> str:
    return value[:limit] if isinstance(value, str) else ""


def _buttons(raw: object) -> tuple[Button, ...]:
    if not isinstance(raw, list):
        return ()
    found = []
    for index, button in enumerate(raw):
        if isinstance(button, dict):
            kind = _text(button.get("type"), 32).upper()
            found.append(Button(index, kind, _text(button.get("text"), 200), _text(button.get("url"), 2000)))
    return tuple(found)


def parse_template(raw: object) -> Template | None:
    """One template of Meta's answer, or None when it has no name, language or known status."""
    if not isinstance(raw, dict):
        return None
    name, language = _text(raw.get("name"), NAME_MAX), _text(raw.get("language"), 10)
    status = _text(raw.get("status"), 20).upper()
    if not name.strip() or not language.strip() or status not in STATUSES:
        return None
    parts: dict[str, Any] = {}
    components = raw.get("components")
    kept = [c for c in components if isinstance(c, dict)] if isinstance(components, list) else []
    for component in kept:
        kind = _text(component.get("type"), 16).upper()
        if kind == "HEADER":
            parts["header_format"] = _text(component.get("format"), 16).upper()
            parts["header_text"] = _text(component.get("text"), 200)
        elif kind in ("BODY", "FOOTER"):
            parts[kind.lower()] = _text(component.get("text"))
        elif kind == "BUTTONS":
            parts["buttons"] = _buttons(component.get("buttons"))
    return Template(
        meta_id=_text(raw.get("id"), 64),
        name=name,
        language=language,
        status=status,
        category=_text(raw.get("category"), 20).upper(),
        components=kept,
        **parts,
    )


def parse_page(data: object) -> tuple[list[Template], str]:
    """(the page's readable templates, the cursor of the next page or "" on the last one)."""
    if not isinstance(data, dict):
        raise IntegrationError("message_templates: the answer is not a JSON object", retryable=False)
    rows = data.get("data")
    templates = [t for t in (parse_template(r) for r in rows) if t] if isinstance(rows, list) else []
    paging = data.get("paging")
    cursors = paging.get("cursors") if isinstance(paging, dict) else None
    after = cursors.get("after") if isinstance(cursors, dict) else None
    has_next = isinstance(paging, dict) and bool(paging.get("next"))
    return templates, (after if has_next and isinstance(after, str) else "")


def _pages(client: httpx.Client, url: str, access_token: str) -> Iterator[list[Template]]:
    after = ""
    for _page in range(MAX_PAGES):
        params = {"fields": FIELDS, "limit": str(PAGE_SIZE), **({"after": after} if after else {})}
        try:
            response = client.get(url, params=params, headers={"Authorization": f"Bearer {access_token}"})
        except httpx.HTTPError as exc:
            raise http.no_answer_error("message_templates", exc, idempotent=True) from exc
        if response.status_code != 200:
            raise http.status_error("message_templates", response, details=response.text)
        try:
            data = response.json()
        except ValueError as exc:
            raise IntegrationError("message_templates: the answer is not JSON", retryable=False) from exc
        templates, after = parse_page(data)
        yield templates
        if not after:
            return


def fetch_templates(*, base_url: str, version: str, waba_id: str, access_token: str) -> list[Template]:
    """Every template of the business account, all pages. Raises IntegrationError (retryable when
    Meta or the network may answer later)."""
    if not waba_id.isdigit():
        raise IntegrationError(f"business account id {waba_id!r} is not a number", retryable=False)
    url = f"{base_url.rstrip('/')}/{version}/{waba_id}/message_templates"
    with http.client() as client:
        return [t for page in _pages(client, url, access_token) for t in page]
