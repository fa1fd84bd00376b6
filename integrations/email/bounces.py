"""What an SMTP failure means for the recipient and the sender (pure: replies/exceptions in, a decision out).

Precedence, first match wins:
1. sender-side problems (auth, relay, TLS, connection, 421/454/530/534/535/538): never a bounce;
2. the enhanced status code's class digit (5.2.2 "mailbox full" is the one soft 5.x.x);
3. mailbox-full/greylisting wording, which servers often send with a 5xx reply code;
4. the reply code's class (4xx soft, 5xx hard);
5. "user unknown" wording when there is no code at all;
6. anything else is soft, so it is retried rather than losing the customer.
"""

from __future__ import annotations

import re
import smtplib
import unicodedata
from dataclasses import dataclass
from enum import StrEnum


class BounceType(StrEnum):
    HARD = "hard"  # the address is dead: stop sending to it
    SOFT = "soft"  # the address may work later: retry


class Failure(StrEnum):
    HARD_BOUNCE = "hard_bounce"
    SOFT_BOUNCE = "soft_bounce"
    SENDER = "sender"  # our side is broken: leave the recipient alone, pause the organization's sending


@dataclass(frozen=True)
class SmtpFailure:
    kind: Failure
    code: int | None
    enhanced: str | None
    message: str

    @property
    def bounce_type(self) -> BounceType | None:
        """HARD or SOFT for a bounce; None for a sender-side failure, which says nothing of the recipient."""
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
    r"|autentica[c\ufffd][a\ufffd]o\s+(e\s+)?(necess[a\ufffd]ria|obrigat[o\ufffd]ria|falhou|inv[a\ufffd]lida)"
)
# Postfix says "User unknown in relay recipient table": the word alone is only trusted next to 5.7.1.
_RELAY_WORD = re.compile(r"\brelay(ing)?\b")
_SOFT_TEXT = re.compile(
    r"quota|\bfull\b|insufficient\s+(system\s+)?storage|greylist|graylist"
    r"|try\s+(again\s+)?later|\bcheia\b|\bcota\b|tente\s+(novamente\s+)?mais\s+tarde"
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


def _from_exception(exc: BaseException, *, kind: Failure) -> SmtpFailure:
    detail = str(exc)
    message = f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__
    return SmtpFailure(kind=kind, code=None, enhanced=None, message=message)


def _decode(value: bytes | str) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else value


def _normalize(text: str) -> str:
    decomposed = unicodedata.normalize("NFKD", text.lower())
    return "".join(char for char in decomposed if not unicodedata.combining(char))
