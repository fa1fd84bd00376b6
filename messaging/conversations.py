"""WhatsApp conversations: the words customers opt out and back in with, the 24-hour window, and the
one way to send a free-form reply (Chatwoot agents, managers on the customer's page, confirmations,
flows all call `reply_queue`).

Meta allows a free-form message only within 24 hours of the customer's last message to that number
(the customer-service window); outside it the API refuses with 131047, and so do we, before
anything is sent: the reply is recorded REFUSED with the reason.
"""

from __future__ import annotations

import json
import logging
import unicodedata
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Max
from django.utils import timezone
from django.utils.translation import gettext as _

from crm import aio, jobs, queues
from crm.models import Customer
from integrations.clients import graph_client
from integrations.models import ChatwootAccount, WhatsappNumber
from messaging import chatwoot_delivery, chatwoot_inbound, decisions
from messaging.models import ConversationMessage, ConversationSettings

logger = logging.getLogger(__name__)

WINDOW = timedelta(hours=24)
REPLY_TASK = "messaging.tasks.conversation_reply_send"
Direction = ConversationMessage.Direction
Status = ConversationMessage.Status
Source = ConversationMessage.Source
HANDOFF_KIND = chatwoot_delivery.HANDOFF_KIND
# Texts that can carry a keyword (a media caption or a reaction never opts anyone out).
KEYWORD_KINDS = frozenset({"text", "button", "interactive"})


# Dropped anywhere: accents and other marks, and invisible format characters (zero-width spaces
# and joiners, direction marks, soft hyphens, a byte-order mark) that keyboards and apps slip in.
_DROPPED = frozenset({"Mn", "Me", "Cf"})


def _bare(text: str) -> str:
    return "".join(c for c in text if unicodedata.category(c) not in _DROPPED)


def _edge(c: str) -> bool:
    """Trimmed from both ends: spaces, punctuation (“smart” quotes, «», ¡¿ too) and symbols (✋🛑)."""
    return c.isspace() or unicodedata.category(c)[0] in "PSZ"


def normalize(text: str) -> str:
    """A keyword as compared: compatibility forms folded (fullwidth letters), case folded, without accents or
    invisible characters, spaces inside collapsed, trimmed of spaces, punctuation and symbols."""
    bare = _bare(unicodedata.normalize("NFKD", text))
    words = " ".join(_bare(unicodedata.normalize("NFKD", bare.casefold())).split())
    start, end = 0, len(words)
    while start < end and _edge(words[start]):
        start += 1
    while end > start and _edge(words[end - 1]):
        end -= 1
    return words[start:end]


def keyword_set(lines: str) -> frozenset[str]:
    """The normalized keywords of a settings field (one per line, commas also split)."""
    return frozenset(w for w in (normalize(x) for x in lines.replace(",", "\n").splitlines()) if w)


def settings_for(organization_id: int) -> ConversationSettings:
    """The organization's conversation settings, created with the defaults when it has none."""
    found, _created = ConversationSettings.objects.get_or_create(organization_id=organization_id)
    return found


@dataclass(frozen=True)
class Keywords:
    opt_out: frozenset[str]
    resume: frozenset[str]
    buttons: frozenset[str]

    @classmethod
    def of(cls, conversation_settings: ConversationSettings) -> Keywords:
        return cls(
            opt_out=keyword_set(conversation_settings.opt_out_keywords),
            resume=keyword_set(conversation_settings.resume_keywords),
            buttons=keyword_set(conversation_settings.opt_out_buttons),
        )

    def intent(self, *, kind: str, text: str, payload: str = "") -> str:
        """ "opt_out", "resume" or "" for one inbound message: its whole text is a keyword, or a quick
        reply's title or payload is one of the opt-out buttons (or an opt-out keyword)."""
        if kind not in KEYWORD_KINDS:
            return ""
        said = {normalize(text), normalize(payload)} - {""}
        if said & self.opt_out or (kind != "text" and said & self.buttons):
            return "opt_out"
        if said & self.resume:
            return "resume"
        return ""


def window_until(*, customer_id: int, number_id: int | None, now: datetime | None = None) -> datetime | None:
    """When the 24-hour window of (number, customer) closes, or None when it is closed."""
    last = (
        ConversationMessage.objects.filter(
            customer_id=customer_id, whatsapp_number_id=number_id, direction=Direction.INBOUND
        )
        .aggregate(last=Max("at"))
        .get("last")
    )
    if last is None:
        return None
    until: datetime = last + WINDOW
    return until if until > (now or timezone.now()) else None


def reply_number(customer_id: int) -> WhatsappNumber | None:
    """The number the customer last wrote to (a reply goes out from the same number)."""
    number_id = (
        ConversationMessage.objects.filter(
            customer_id=customer_id, direction=Direction.INBOUND, whatsapp_number__isnull=False
        )
        .order_by("-at", "-id")
        .values_list("whatsapp_number_id", flat=True)
        .first()
    )
    return WhatsappNumber.objects.filter(pk=number_id).first() if number_id else None


def reply_queue(
    *,
    customer: Customer,
    text: str,
    source: str,
    number: WhatsappNumber | None = None,
    sent_by_id: int | None = None,
    chatwoot_message_id: int | None = None,
) -> ConversationMessage:
    """Record a free-form reply to the customer and enqueue its send (after commit). From `number`,
    else the number the customer last wrote to. Outside the 24-hour window nothing is sent: the
    reply is returned REFUSED with the reason."""
    number = number or reply_number(customer.pk)
    message = ConversationMessage(
        organization_id=customer.organization_id,
        customer=customer,
        whatsapp_number=number,
        store_id=number.store_id if number is not None else None,
        direction=Direction.OUTBOUND,
        text=text.strip()[:4096],
        source=source,
        sent_by_id=sent_by_id,
        chatwoot_message_id=chatwoot_message_id,
        status=Status.QUEUED,
    )
    if not message.text:
        message.status, message.error = Status.REFUSED, _("An empty message cannot be sent.")
    elif number is None or not customer.phone:
        message.status, message.error = Status.REFUSED, _("This customer never wrote to a WhatsApp number.")
    elif window_until(customer_id=customer.pk, number_id=number.pk) is None:
        message.status = Status.REFUSED
        message.error = _(
            "Outside the 24-hour window: the customer last wrote more than 24 hours ago. "
            "Only a template message can be sent now."
        )
    message.save()
    if message.status == Status.QUEUED:
        jobs.enqueue(
            REPLY_TASK,
            queue=queues.WHATSAPP_SEND,
            kwargs={"message_id": message.pk},
            organization_id=customer.organization_id,
            attempts=1,
        )
    return message


def handoff_queue(
    *,
    customer: Customer,
    flow_name: str,
    note: str = "",
    assignee_id: int | None = None,
    team_id: int | None = None,
) -> ConversationMessage:
    """Hand the customer to a person: a note naming the flow on the customer's conversation (the
    customer's page shows it; the customer gets nothing) and, when the organization has Chatwoot,
    the same as a private note on the contact's conversation there, opened (and assigned) by the
    Chatwoot push — in order with the conversation's messages, waiting while Chatwoot is down."""
    text = _("Handed over by the flow “%(flow)s”.") % {"flow": flow_name}
    if note.strip():
        text = f"{text} {note.strip()}"
    chatwoot = ChatwootAccount.objects.filter(organization_id=customer.organization_id, enabled=True).exists()
    message = ConversationMessage.objects.create(
        organization_id=customer.organization_id,
        customer=customer,
        direction=Direction.OUTBOUND,
        kind=HANDOFF_KIND,
        text=text[:4096],
        # Who to assign it to in Chatwoot (read by the push).
        payload=json.dumps({"assignee_id": assignee_id, "team_id": team_id}, separators=(",", ":")),
        source=Source.FLOW,
        status=Status.NOTE,
        chatwoot_pending=chatwoot and bool(customer.phone),
        error=_("No phone number: not handed over in Chatwoot.") if chatwoot and not customer.phone else "",
    )
    if message.chatwoot_pending:
        chatwoot_inbound.push_enqueue(organization_id=customer.organization_id)
    return message


def reply_send(*, message_id: int) -> str:
    """Send one queued reply (claimed first: a second run sends nothing); returns its status. The
    window is checked again at send time; an answer that is not a success fails it with the reason
    (a timed-out send is never resent: Meta may have it)."""
    if not ConversationMessage.objects.filter(pk=message_id, status=Status.QUEUED).update(
        status=Status.SENDING
    ):
        return "claimed elsewhere"
    message = ConversationMessage.objects.select_related("customer", "whatsapp_number").get(pk=message_id)
    number, customer = message.whatsapp_number, message.customer
    if number is None or window_until(customer_id=customer.pk, number_id=number.pk) is None:
        return _finish(message, error=_("Outside the 24-hour window: not sent."), status=Status.REFUSED)
    client = graph_client(number.graph_url or settings.WHATSAPP_GRAPH_URL)
    result = aio.run(
        client.send_text(
            phone_number_id=number.phone_number_id,
            access_token=number.get_access_token(),
            to=customer.phone.lstrip("+"),
            text=message.text,
        )
    )
    decision = decisions.whatsapp(result, attempts=1, max_attempts=1)
    if decision.verdict == decisions.Verdict.SENT:
        return _finish(message, wamid=result.wamid)
    return _finish(message, error=decision.reason or str(result.error))


def _finish(message: ConversationMessage, *, wamid: str = "", error: str = "", status: str = "") -> str:
    status = status or (Status.FAILED if error else Status.SENT)
    # A reply written here (not by an agent in Chatwoot) is shown to the agents there too.
    mirror = (
        status == Status.SENT
        and message.source != Source.CHATWOOT
        and ChatwootAccount.objects.filter(organization_id=message.organization_id, enabled=True).exists()
    )
    ConversationMessage.objects.filter(pk=message.pk).update(
        status=status, wamid=wamid or None, error=error[:2000], at=timezone.now(), chatwoot_pending=mirror
    )
    if mirror:
        chatwoot_inbound.push_enqueue(organization_id=message.organization_id)
    if error:
        logger.warning(
            "conversation reply %s not sent: %s",
            message.pk,
            error,
            extra={"organization_id": message.organization_id},
        )
    return str(status)
