"""What every sender keeps: the organization's email suppression list, and the WhatsApp conversations
with its customers (what they sent, the replies, the words they opt out with)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone as dj_timezone
from django.utils.translation import gettext_lazy as _

from crm.models import Organization


class EmailSuppression(models.Model):
    """An address the organization never emails again (a hard bounce, a complaint, an operator)."""

    class Reason(models.TextChoices):
        HARD_BOUNCE = "hard_bounce", _("hard bounce")
        COMPLAINT = "complaint", _("spam complaint")
        MANUAL = "manual", _("added by an operator")

    organization = models.ForeignKey(
        Organization,
        on_delete=models.CASCADE,
        related_name="email_suppressions",
        verbose_name=_("organization"),
    )
    email = models.EmailField(_("address"))  # stored lower-cased
    reason = models.CharField(_("reason"), max_length=20, choices=Reason.choices)
    detail = models.TextField(_("detail"), blank=True, default="")
    created_at = models.DateTimeField(_("created at"), default=dj_timezone.now, editable=False)

    class Meta:
        # Created by the campaigns app (campaigns 0003), moved here with its table (messaging 0001).
        db_table = "campaigns_emailsuppression"
        verbose_name = _("email suppression")
        verbose_name_plural = _("email suppressions")
        constraints = [
            models.UniqueConstraint(fields=["organization", "email"], name="email_suppression_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.email} ({self.reason})"


DEFAULT_OPT_OUT_KEYWORDS = "PARAR\nSAIR\nSTOP\nCANCELAR\nDESCADASTRAR"
DEFAULT_RESUME_KEYWORDS = "VOLTAR\nRETOMAR\nSTART"
DEFAULT_OPT_OUT_BUTTONS = "Parar promoções\nNão quero receber"
DEFAULT_OPT_OUT_CONFIRMATION = (
    "Pronto, você não vai mais receber nossas promoções pelo WhatsApp. "
    "Se mudar de ideia, é só responder VOLTAR."
)
DEFAULT_RESUME_CONFIRMATION = (
    "Que bom ter você de volta! Você voltará a receber nossas promoções pelo WhatsApp."
)


class ConversationSettings(models.Model):
    """What an organization's WhatsApp conversations honour: its opt-out and resume words and what
    the customer is told. One row per organization, created with the defaults when first needed."""

    organization = models.OneToOneField(
        Organization,
        on_delete=models.CASCADE,
        related_name="conversation_settings",
        verbose_name=_("organization"),
    )
    opt_out_keywords = models.TextField(
        _("opt-out keywords"),
        default=DEFAULT_OPT_OUT_KEYWORDS,
        help_text=_("One per line. Compared without case, accents or surrounding spaces and punctuation."),
    )
    opt_out_buttons = models.TextField(
        _("opt-out buttons"),
        default=DEFAULT_OPT_OUT_BUTTONS,
        blank=True,
        help_text=_("Titles or payloads of the templates' opt-out quick-reply buttons, one per line."),
    )
    resume_keywords = models.TextField(
        _("resume keywords"), default=DEFAULT_RESUME_KEYWORDS, blank=True, help_text=_("One per line.")
    )
    opt_out_confirmation = models.TextField(
        _("opt-out confirmation"), default=DEFAULT_OPT_OUT_CONFIRMATION, blank=True
    )
    resume_confirmation = models.TextField(
        _("resume confirmation"), default=DEFAULT_RESUME_CONFIRMATION, blank=True
    )

    class Meta:
        verbose_name = _("conversation settings")
        verbose_name_plural = _("conversation settings")

    def __str__(self) -> str:
        return f"{self.organization}"


class ConversationMessage(models.Model):
    """One WhatsApp message of a conversation between a business number and a customer: what the
    customer sent (inbound, every type, once per wamid), the free-form replies sent back, and the
    copy of each campaign message sent to an organization with Chatwoot (source "campaign", sent
    by campaigns: it only waits for Chatwoot, in order with the rest of the conversation)."""

    class Direction(models.TextChoices):
        INBOUND = "in", _("from the customer")
        OUTBOUND = "out", _("to the customer")

    class Status(models.TextChoices):
        RECEIVED = "received", _("received")
        QUEUED = "queued", _("queued")
        SENDING = "sending", _("sending")
        SENT = "sent", _("sent")
        FAILED = "failed", _("failed")
        REFUSED = "refused", _("refused (outside the 24-hour window)")
        NOTE = "note", _("note for the agents (not sent to the customer)")

    class Source(models.TextChoices):
        CUSTOMER = "customer", _("the customer")
        CHATWOOT = "chatwoot", _("an agent in Chatwoot")
        MANAGER = "manager", _("a manager on the customer's page")
        CONFIRMATION = "confirmation", _("an opt-out or resume confirmation")
        FLOW = "flow", _("a flow")
        CAMPAIGN = "campaign", _("a campaign")

    organization = models.ForeignKey(
        Organization,
        on_delete=models.CASCADE,
        related_name="+",
        verbose_name=_("organization"),
        db_index=False,
    )
    customer = models.ForeignKey(
        "crm.Customer",
        on_delete=models.CASCADE,
        related_name="conversation_messages",
        verbose_name=_("customer"),
        db_index=False,
    )
    whatsapp_number = models.ForeignKey(
        "integrations.WhatsappNumber",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name=_("business number"),
        db_index=False,
    )
    store = models.ForeignKey(
        "crm.Store",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name=_("store"),
        db_index=False,
    )
    direction = models.CharField(_("direction"), max_length=3, choices=Direction.choices)
    kind = models.CharField(_("type"), max_length=16, default="text")
    text = models.TextField(_("text"), blank=True, default="")
    payload = models.CharField(_("button payload or reply id"), max_length=256, blank=True, default="")
    media_id = models.CharField(_("Meta media id"), max_length=128, blank=True, default="")
    media_mime = models.CharField(_("media type"), max_length=100, blank=True, default="")
    media_filename = models.CharField(_("file name"), max_length=255, blank=True, default="")
    wamid = models.CharField(_("Meta message id"), max_length=128, null=True, blank=True)  # noqa: DJ001
    context_wamid = models.CharField(_("answers Meta message"), max_length=128, blank=True, default="")
    # The campaign and campaign message answered (plain ids: the campaigns app sits above this one).
    campaign_id = models.BigIntegerField(_("campaign answered"), null=True, blank=True)
    campaign_message_id = models.BigIntegerField(_("campaign message answered"), null=True, blank=True)
    at = models.DateTimeField(_("at"), default=dj_timezone.now)
    status = models.CharField(_("status"), max_length=10, choices=Status.choices, default=Status.RECEIVED)
    source = models.CharField(_("written by"), max_length=14, choices=Source.choices, default=Source.CUSTOMER)
    sent_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name=_("sent by"),
        db_index=False,
    )
    error = models.TextField(_("error"), blank=True, default="")
    # Chatwoot: an inbound message waits (pending) until it is an incoming message there; an
    # agent's reply keeps the id of its Chatwoot message (a repeated webhook sends nothing twice).
    chatwoot_pending = models.BooleanField(_("waiting for Chatwoot"), default=False)
    chatwoot_message_id = models.BigIntegerField(_("Chatwoot message id"), null=True, blank=True)
    chatwoot_error = models.TextField(_("Chatwoot error"), blank=True, default="")
    created_at = models.DateTimeField(_("created at"), default=dj_timezone.now, editable=False)

    class Meta:
        verbose_name = _("conversation message")
        verbose_name_plural = _("conversation messages")
        constraints = [
            models.UniqueConstraint(
                fields=["wamid"], name="convmsg_wamid_unique", condition=Q(wamid__isnull=False)
            ),
            models.UniqueConstraint(
                fields=["organization", "chatwoot_message_id"],
                name="convmsg_chatwoot_unique",
                condition=Q(chatwoot_message_id__isnull=False, direction="out"),
            ),
        ]
        indexes = [
            # The customer's page, and the 24-hour window (the last inbound per number).
            models.Index(fields=["customer", "at"], name="convmsg_customer_at"),
            # A campaign's replies (campaign_status, its page).
            models.Index(
                fields=["campaign_id", "at"],
                name="convmsg_campaign_at",
                condition=Q(campaign_id__isnull=False),
            ),
            # What waits for Chatwoot, per organization, in order.
            models.Index(
                fields=["organization", "id"],
                name="convmsg_chatwoot_pending",
                condition=Q(chatwoot_pending=True),
            ),
            # The dashboard's replies per store.
            models.Index(
                fields=["organization", "at"], name="convmsg_org_inbound_at", condition=Q(direction="in")
            ),
        ]

    def __str__(self) -> str:
        return f"{self.get_direction_display()} {self.kind} {self.at:%Y-%m-%d %H:%M}"


class ChatwootThread(models.Model):
    """Where a customer's messages go in Chatwoot, per inbox: the contact and conversation ids found
    or created once, so each later message costs one call (messaging.chatwoot_inbound)."""

    organization = models.ForeignKey(
        Organization, on_delete=models.CASCADE, related_name="+", verbose_name=_("organization")
    )
    inbox_id = models.PositiveIntegerField(_("Chatwoot inbox id"))
    customer = models.ForeignKey(
        "crm.Customer", on_delete=models.CASCADE, related_name="+", verbose_name=_("customer"), db_index=False
    )
    contact_id = models.BigIntegerField(_("Chatwoot contact id"))
    conversation_id = models.BigIntegerField(_("Chatwoot conversation id"))

    class Meta:
        verbose_name = _("Chatwoot conversation")
        verbose_name_plural = _("Chatwoot conversations")
        constraints = [
            models.UniqueConstraint(
                fields=["customer", "inbox_id", "organization"], name="chatwoot_thread_once"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.customer_id} @ {self.inbox_id}: {self.conversation_id}"
