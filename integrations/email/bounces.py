"""What an SMTP failure means for the recipient and the sender (pure: replies/exceptions in, a decision out).

Precedence, first match wins:
1. sender-side problems (auth, relay, TLS, connection, 421/454/530/534/535/538): never a bounce;
2. a permanent policy block: 5.7.x (security or policy status, RFC 3463/7372: "delivery not
   authorized", a blocklist, reputation, content, DMARC), or, without a more precise enhanced code,
   wording such as "blocked using Spamhaus" or "rejected due to policy". It says nothing about the
   address (5.7.13 "account disabled" and 5.7.17 "mailbox owner changed" do, and stay hard), so it
   is BLOCKED: recorded apart, never suppressed;
3. the enhanced status code's class digit (5.2.2 "mailbox full" is the one soft 5.x.x);
4. mailbox-full/greylisting wording, which servers often send with a 5xx reply code;
5. the reply code's class (4xx soft, 5xx hard);
6. "user unknown" wording when there is no code at all;
7. anything else is soft, so it is retried rather than losing the customer.

A temporary block (4.7.x, "try again later") stays soft: it is retried like any other.

ESP tracking events are classified by `classify_esp_bounce`: the ESP's own block markers (SendGrid's
bounce of type "blocked", Mailgun's "espblock", Postmark's "Blocked"/"DMARCPolicy"), else the mail
server's reply it carries, read with the rules above.
"""

from __future__ import annotations

import re
import smtplib
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum


class BounceType(StrEnum):
    HARD = "hard"  # the address is dead: stop sending to it
    SOFT = "soft"  # the address may work later: retry


class Failure(StrEnum):
    HARD_BOUNCE = "hard_bounce"
    SOFT_BOUNCE = "soft_bounce"
    # Refused by the receiving server's policy (blocklisted IP, reputation, content, DMARC): the
    # address may be fine, so it is never suppressed; nor is it retried soon, the block outlasts a retry.
    BLOCKED = "blocked"
    SENDER = "sender"  # our side is broken: leave the recipient alone, pause the organization's sending


@dataclass(frozen=True)
class SmtpFailure:
    kind: Failure
    code: int | None
    enhanced: str | None
    message: str

    @property
    def bounce_type(self) -> BounceType | None:
        """HARD or SOFT for a bounce; None for a block or a sender-side failure, which say nothing of the
        recipient."""
        if self.kind is Failure.HARD_BOUNCE:
            return BounceType.HARD
        if self.kind is Failure.SOFT_BOUNCE:
            return BounceType.SOFT
        return None


# 421 closing channel, 454 TLS/temporary auth failure, 530 auth required, 534 mechanism too weak
# (Gmail's "log in via your web browser"), 535 bad credentials, 538 encryption required for auth.
_SENDER_CODES = frozenset({421, 454, 530, 534, 535, 538})
# 5.7.8 bad credentials, 5.7.9 mechanism too weak, 5.7.11 encryption required for auth.
_SENDER_ENHANCED = frozenset({"5.7.8", "5.7.9", "5.7.11"})
# The one 5.x.x that servers use for a full mailbox, which empties eventually.
_SOFT_ENHANCED = frozenset({"5.2.2"})
# 5.7.x statuses that do speak of the address: account disabled, mailbox owner changed (RFC 7372).
_ADDRESS_ENHANCED = frozenset({"5.7.13", "5.7.17"})

_CODE_PREFIX = re.compile(r"^\s*([2-5]\d\d)(?:[ -]|$)")
# The requirement's \b[245]\.\d{1,3}\.\d{1,3}\b, guarded so that "host 200.4.1.20" is not read as 4.1.20.
_ENHANCED = re.compile(r"(?<![\d.])[245]\.\d{1,3}\.\d{1,3}(?!\.?\d)")
_LEADING_ENHANCED = re.compile(r"^\s*[245]\.\d{1,3}\.\d{1,3}\b\s*")

# Patterns run on lower-cased text with accents stripped; "\ufffd" is what a Latin-1 "á"/"ã" becomes
# once decoded as UTF-8 with replacement, as older Brazilian servers send it.
_SENDER_TEXT = re.compile(
    r"relay(ing)?\s+(access\s+)?(denied|not\s+(permitted|allowed)|prohibited)"
    r"|(not\s+(permitted|allowed)|unable|we\s+do\s+not)\s+(to\s+)?relay"
    r"|authentication\s+(is\s+)?(required|failed|unsuccessful|credentials\s+invalid)"
    r"|username\s+and\s+password\s+not\s+accepted"
    r"|must\s+issue\s+a\s+starttls"
    r"|sender\s+address\s+rejected:\s+not\s+owned"  # Postfix: our login may not use this From
    r"|autentica[c\ufffd][a\ufffd]o\s+(e\s+)?(necess[a\ufffd]ria|obrigat[o\ufffd]ria|falhou|inv[a\ufffd]lida)"
)
# Postfix says "User unknown in relay recipient table": the word alone is only trusted next to 5.7.1.
_RELAY_WORD = re.compile(r"\brelay(ing)?\b")
_SOFT_TEXT = re.compile(
    r"quota|\bfull\b|insufficient\s+(system\s+)?storage|greylist|graylist"
    r"|try\s+(again\s+)?later|\bcheia\b|\bcota\b|tente\s+(novamente\s+)?mais\s+tarde"
)
# Policy refusals as servers word them (Spamhaus, Spamcop, Barracuda, Microsoft, Gmail, Yahoo, UOL...).
_BLOCKED_TEXT = re.compile(
    r"\bblock(ed|ing)?\b|block\s*list|black\s*list(ed)?|blacklist|deny\s*list|\blisted\s+(at|in|on|by)\b"
    r"|spamhaus|spamcop|barracuda|sorbs|\bs?rbl\b|dnsbl|\bspam\b|reputation|\bpolicy\b|policies"
    r"|rejected\s+(due\s+to|for)\s+(policy|content|spam)|content\s+(rejected|filter)"
    r"|bloquead[oa]|lista\s+negra|pol[i\ufffd]tica"
)
_HARD_TEXT = re.compile(
    r"user\s+unknown|unknown\s+(user|recipient)|recipient\s+unknown|not\s+found|no\s+such\s+(user|recipient|mailbox)"
    r"|does\s+not\s+exist|doesn'?t\s+exist|mailbox\s+unavailable|invalid\s+(recipient|mailbox)"
    r"|usu[a\ufffd]rio\s+desconhecido|n[a\ufffd]o\s+existe|inexistente"
)


def parse_reply(text: str) -> tuple[int | None, str | None, str]:
    """(code, enhanced status, text without either) of a one- or multi-line reply; None where absent."""
    code: int | None = None
    parts: list[str] = []
    for line in text.splitlines():
        match = _CODE_PREFIX.match(line)
        if match:
            code = code if code is not None else int(match.group(1))
            line = line[match.end() :]
        parts.append(_LEADING_ENHANCED.sub("", line, count=1).strip())
    found = _ENHANCED.search(text)
    return code, found.group(0) if found else None, " ".join(part for part in parts if part)


def classify_reply(code: int | None, text: str) -> SmtpFailure:
    """The failure an SMTP reply means; `code` wins over one parsed from `text`, unknown replies are soft."""
    parsed_code, enhanced, message = parse_reply(text)
    if code is None or not 100 <= code <= 599:  # smtplib uses -1 for an unparseable reply
        code = parsed_code
    kind = _kind(code, enhanced, _normalize(text))
    return SmtpFailure(kind=kind, code=code, enhanced=enhanced, message=message or text.strip())


def classify_exception(exc: BaseException) -> SmtpFailure:
    """The failure an exception from smtplib/ssl/socket means; connection-level errors are always SENDER."""
    if isinstance(exc, smtplib.SMTPRecipientsRefused):
        refusals = [classify_reply(code, _decode(msg)) for code, msg in exc.recipients.values()]
        # A campaign message has one recipient; should there be more, pausing the sender matters most.
        for failure in refusals:
            if failure.kind is Failure.SENDER:
                return failure
        return refusals[0] if refusals else _from_exception(exc, kind=Failure.SOFT_BOUNCE)
    if isinstance(
        exc,
        smtplib.SMTPSenderRefused
        | smtplib.SMTPAuthenticationError
        | smtplib.SMTPConnectError
        | smtplib.SMTPHeloError,
    ):
        # Whatever the code, these replies are about our account, our From address or our host.
        reply = classify_reply(exc.smtp_code, _decode(exc.smtp_error))
        message = reply.message or type(exc).__name__
        return SmtpFailure(kind=Failure.SENDER, code=reply.code, enhanced=reply.enhanced, message=message)
    if isinstance(exc, smtplib.SMTPResponseException):  # SMTPDataError and any other coded reply
        return classify_reply(exc.smtp_code, _decode(exc.smtp_error))
    if isinstance(exc, smtplib.SMTPException | OSError):
        # Disconnects, missing AUTH/STARTTLS, TLS handshakes, refused/timed-out connections, DNS:
        # nothing reached a mailbox, so the recipient is not to blame. (ssl.SSLError,
        # ConnectionRefusedError and TimeoutError, alias socket.timeout, are all OSErrors.)
        return _from_exception(exc, kind=Failure.SENDER)
    return _from_exception(exc, kind=Failure.SOFT_BOUNCE)


def _kind(code: int | None, enhanced: str | None, text: str) -> Failure:
    if code in _SENDER_CODES or enhanced in _SENDER_ENHANCED or _SENDER_TEXT.search(text):
        return Failure.SENDER
    if enhanced == "5.7.1" and _RELAY_WORD.search(text):
        return Failure.SENDER
    if _is_blocked(code, enhanced, text):
        return Failure.BLOCKED
    if enhanced in _SOFT_ENHANCED or (enhanced is not None and enhanced.startswith("4.")):
        return Failure.SOFT_BOUNCE
    if enhanced is not None and enhanced.startswith("5."):
        return Failure.HARD_BOUNCE
    if _SOFT_TEXT.search(text):
        return Failure.SOFT_BOUNCE
    if code is not None and 400 <= code <= 499:
        return Failure.SOFT_BOUNCE
    if code is not None and 500 <= code <= 599:
        return Failure.HARD_BOUNCE
    if code is None and _HARD_TEXT.search(text):
        return Failure.HARD_BOUNCE
    return Failure.SOFT_BOUNCE


def _is_blocked(code: int | None, enhanced: str | None, text: str) -> bool:
    """A permanent refusal by policy (see the module's precedence, rule 2)."""
    if enhanced is not None and enhanced.startswith("5.7."):
        return enhanced not in _ADDRESS_ENHANCED
    if enhanced not in (None, "5.0.0"):  # a precise enhanced code says what it is
        return False
    permanent = (code is not None and 500 <= code <= 599) or enhanced == "5.0.0"
    return permanent and bool(_BLOCKED_TEXT.search(text))


# Raw fields of ESP events that mark a policy block, and the values that do (the ESP's own words).
_ESP_BLOCK_MARKERS: dict[str, frozenset[str]] = {
    "type": frozenset({"blocked"}),  # SendGrid: a bounce event of type "blocked" (vs "bounce")
    "reason": frozenset({"espblock", "blacklisted"}),  # Mailgun: event-data.reason of a failed event
    "Type": frozenset({"Blocked", "DMARCPolicy"}),  # Postmark: the bounce's Type (ISP block, DMARC)
}
# Raw fields of ESP events that mark a soft bounce reported as a bounce (the address may still work).
_ESP_SOFT_MARKERS: dict[str, frozenset[str]] = {
    "Type": frozenset({"SoftBounce"}),  # Postmark
    "event": frozenset({"soft_bounce"}),  # Brevo
}


def esp_event_markers(raw: object) -> dict[str, str]:
    """The short fields of an ESP's raw event that name its kind ("Type", "type", "event", and
    Mailgun's nested event-data "event" and "reason"), which `classify_esp_bounce` reads: small
    enough to keep while the send is being recorded."""
    if not isinstance(raw, Mapping):
        return {}
    markers = {k: raw[k] for k in ("Type", "type", "event") if isinstance(raw.get(k), str)}
    nested = raw.get("event-data")  # Mailgun
    if isinstance(nested, Mapping):
        markers.update({k: nested[k] for k in ("event", "reason") if isinstance(nested.get(k), str)})
    return markers


def classify_esp_bounce(*, markers: Mapping[str, str], response: str) -> Failure:
    """What an ESP's bounce or rejection event means: BLOCKED (the ESP says so, or the server's
    `response` is a policy block), SOFT_BOUNCE (the ESP says the address may still work), else
    HARD_BOUNCE. `markers`: `esp_event_markers` of the raw event."""
    if any(markers.get(key) in values for key, values in _ESP_BLOCK_MARKERS.items()):
        return Failure.BLOCKED
    if any(markers.get(key) in values for key, values in _ESP_SOFT_MARKERS.items()):
        return Failure.SOFT_BOUNCE
    if response.strip() and classify_reply(None, response).kind is Failure.BLOCKED:
        return Failure.BLOCKED
    return Failure.HARD_BOUNCE


def _from_exception(exc: BaseException, *, kind: Failure) -> SmtpFailure:
    detail = str(exc)
    message = f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__
    return SmtpFailure(kind=kind, code=None, enhanced=None, message=message)


def _decode(value: bytes | str) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else value


def _normalize(text: str) -> str:
    decomposed = unicodedata.normalize("NFKD", text.lower())
    return "".join(char for char in decomposed if not unicodedata.combining(char))
