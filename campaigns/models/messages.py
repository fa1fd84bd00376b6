"""A campaign's messages, one row per campaign and recipient (WhatsApp, email), and test sends."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from decimal import Decimal

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.db.models.functions import Upper
from django.utils import timezone as dj_timezone
from django.utils.translation import gettext_lazy as _

from crm.models import Customer, Organization

# The reason given to a message whose worker died after claiming it: the provider may or may not
# have accepted it, so it is never sent again (a retry of failed messages leaves it alone). A
# WhatsApp message keeps it as its error_reason in the UNKNOWN status; an email is FAILED with it.
OUTCOME_UNKNOWN = "outcome unknown: the worker stopped during the send; not resent"


def _token() -> str:
    return secrets.token_urlsafe(16)


# Message rows are written a million at a time by the fan-out (campaigns.fanout), so they carry
# only what a query needs:
# - Their foreign keys have no database constraint (MESSAGE_FKS): the three checks cost ~15 µs a
#   row at commit, more than the row itself. The fan-out writes a page's rows from the audience
#   (existing customers, read in the same statement) under a lock on the campaign row
#   (FOR KEY SHARE, the FK check's own lock, once a page), and a campaign being deleted takes that
#   row FOR UPDATE first (campaign_deleting): no message outlives its campaign, and its
#   organization outlives the campaign. Deleting a customer, a campaign or an organization through
#   Django deletes their messages (on_delete=CASCADE is the ORM's). A customer deleted just after a
#   page read it leaves that one message behind: its send batch skips it (skip_without_customer).
# - Unique columns are UniqueConstraints, not unique=True, which on PostgreSQL adds a second
#   `*_like` index (varchar_pattern_ops) for LIKE queries no one runs on a token or a wamid; the
#   ones filled only after the send are partial (WHERE ... IS NOT NULL), so a new row skips them.
# - Every index names the query it serves; the ones on columns set at send time are partial.
MESSAGE_FKS = ("campaign", "organization", "customer")


def message_constraints(prefix: str, *, once_per_campaign: str) -> list[models.BaseConstraint]:
    """The constraints every message table has, named with the table's prefix ("wamsg", "emmsg")."""
    return [
        # The fan-out's idempotence (ON CONFLICT DO NOTHING) and the per-campaign reads.
        models.UniqueConstraint(fields=["campaign", "customer"], name=once_per_campaign),
        # A link's message (campaigns.links.message_for).
        models.UniqueConstraint(fields=["token"], name=f"{prefix}_token_unique"),
    ]


def message_indexes(prefix: str) -> list[models.Index]:
    """The indexes every message table has, named with the table's prefix ("wamsg", "emmsg")."""
    return [
        # A send batch's claim (campaign, batch, queued) and the campaign's queued batches.
        models.Index(fields=["campaign", "batch", "status"], name=f"{prefix}_campaign_batch_status"),
        # With the id, it also serves the admin's list of a campaign's messages in a status, newest first.
        models.Index(fields=["campaign", "status", "id"], name=f"{prefix}_campaign_status_id"),
        # The per-customer message limit and conflict block (campaigns.whatsapp), and deleting a
        # customer's messages.
        models.Index(fields=["customer", "sent_at"], name=f"{prefix}_customer_sent"),
        # Messages stuck in sending (recovery.reconcile_in_flight).
        models.Index(fields=["sending_at"], name=f"{prefix}_sending", condition=Q(status="sending")),
        # The admin's list, newest first, by campaign or status: each page an index range, whatever
        # the table's size. The status one leaves out queued messages: the fan-out does not write
        # it, and the newest messages are the queued ones anyway.
        models.Index(fields=["campaign", "id"], name=f"{prefix}_campaign_id"),
        models.Index(fields=["status", "id"], name=f"{prefix}_status_id_done", condition=~Q(status="queued")),
        # The campaign page's send rate (messages sent in the last minute), polled while it sends.
        models.Index(
            fields=["campaign", "sent_at"],
            name=f"{prefix}_campaign_sent_at",
            condition=Q(sent_at__isnull=False),
        ),
    ]


class CampaignMessage(models.Model):
    """What a campaign's message is on every channel: one row per campaign and customer, claimed by
    a send batch, sent once, then followed by its provider's events. Each channel's model adds its
    campaign and customer (their reverse names are the channel's), its Status, its provider's
    fields, and names its constraints and indexes (message_constraints, message_indexes)."""

    # Declared by each channel's model: the campaign and the customer (their reverse names are the
    # channel's), and the status (its choices are the channel's).
    campaign_id: int
    customer_id: int
    status: str
    get_status_display: Callable[[], str]

    # No database constraint (see MESSAGE_FKS), no index of its own (one less to write per message).
    organization = models.ForeignKey(
        Organization,
        on_delete=models.CASCADE,
        related_name="+",
        verbose_name=_("organization"),
        db_index=False,
        db_constraint=False,
    )
    batch = models.PositiveIntegerField(_("batch"), default=0, help_text=_("The send job that carries it."))
    attempts = models.PositiveSmallIntegerField(_("attempts"), default=0)
    error_reason = models.TextField(_("error reason"), blank=True, default="")
    token = models.CharField(_("link token"), max_length=32, default=_token)
    queued_at = models.DateTimeField(_("queued at"), default=dj_timezone.now)
    sending_at = models.DateTimeField(_("sending since"), null=True, blank=True)
    sent_at = models.DateTimeField(_("sent at"), null=True, blank=True)
    failed_at = models.DateTimeField(_("failed at"), null=True, blank=True)
    clicked_at = models.DateTimeField(_("clicked at"), null=True, blank=True)

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return f"{self.campaign_id}/{self.customer_id} {self.get_status_display()}"


class WhatsappMessage(CampaignMessage):
    class Status(models.TextChoices):
        QUEUED = "queued", _("queued")
        SENDING = "sending", _("sending")
        SENT = "sent", _("sent")
        DELIVERED = "delivered", _("delivered")
        READ = "read", _("read")
        FAILED = "failed", _("failed")
        SKIPPED = "skipped", _("skipped")
        CANCELLED = "cancelled", _("cancelled")
        # Settled without knowing whether Meta accepted it (its worker died mid-send): a status of
        # its own, not FAILED with a reason, because it is neither failed nor sent — it is counted
        # apart, never sent again, and a late status webhook still moves it to sent, delivered,
        # read or failed (campaigns.statuses). A status rather than a flag beside FAILED keeps one
        # truth per row: every count, filter and index by status sees it without a second column.
        UNKNOWN = "unknown", _("outcome unknown")
        # In the campaign's control group (campaigns.lift): never sent; sent_at is when it would
        # have been (its batch's send), where its purchase window starts.
        HELD_OUT = "held_out", _("held out (control)")

    FINAL = (
        Status.SENT,
        Status.DELIVERED,
        Status.READ,
        Status.FAILED,
        Status.SKIPPED,
        Status.CANCELLED,
        Status.UNKNOWN,
        Status.HELD_OUT,
    )
    IN_FLIGHT = (Status.QUEUED, Status.SENDING)

    # No index of their own: the composite indexes lead with them (one index less to write per
    # message on the busiest tables). No database constraint either (see MESSAGE_FKS).
    campaign = models.ForeignKey(
        "campaigns.Campaign",
        on_delete=models.CASCADE,
        related_name="whatsapp_messages",
        verbose_name=_("campaign"),
        db_index=False,
        db_constraint=False,
    )
    customer = models.ForeignKey(
        Customer,
        on_delete=models.CASCADE,
        related_name="whatsapp_messages",
        verbose_name=_("customer"),
        db_index=False,
        db_constraint=False,
    )
    # The number it is sent from, chosen by the fan-out (Campaign.sender). No constraint, no index
    # (see MESSAGE_FKS): nothing looks messages up by number, and a number deleted meanwhile is
    # replaced by the campaign's own (PROTECTed) one at send time. Empty on rows older than the
    # choice: the campaign's number.
    whatsapp_number = models.ForeignKey(
        "integrations.WhatsappNumber",
        on_delete=models.DO_NOTHING,
        null=True,
        blank=True,
        related_name="+",
        verbose_name=_("sent from"),
        db_index=False,
        db_constraint=False,
    )
    status = models.CharField(_("status"), max_length=10, choices=Status.choices, default=Status.QUEUED)
    phone = models.CharField(_("phone"), max_length=16, blank=True, default="")
    wa_id = models.CharField(_("WhatsApp id"), max_length=20, blank=True, default="")
    # NULL until sent: many unsent rows, one unique value each once sent.
    wamid = models.CharField(_("Meta message id"), max_length=128, null=True, blank=True)  # noqa: DJ001
    error_code = models.IntegerField(_("error code"), null=True, blank=True)
    cost = models.DecimalField(_("cost"), max_digits=10, decimal_places=6, default=Decimal("0"))
    cost_currency = models.CharField(_("cost currency"), max_length=3, blank=True, default="")
    delivered_at = models.DateTimeField(_("delivered at"), null=True, blank=True)
    read_at = models.DateTimeField(_("read at"), null=True, blank=True)
    chatwoot_mirrored_at = models.DateTimeField(_("mirrored to Chatwoot at"), null=True, blank=True)

    class Meta:
        verbose_name = _("WhatsApp message")
        verbose_name_plural = _("WhatsApp messages")
        constraints = [
            *message_constraints("wamsg", once_per_campaign="whatsapp_message_once_per_campaign"),
            # A status webhook's message (campaigns.statuses), the admin's search by wamid.
            models.UniqueConstraint(
                fields=["wamid"], name="wamsg_wamid_unique", condition=Q(wamid__isnull=False)
            ),
        ]
        indexes = [
            *message_indexes("wamsg"),
            # The admin's list by error code, and its search by the beginning of a phone number
            # (leaving out the empty phone of a message not sent yet).
            models.Index(
                fields=["error_code", "id"], name="wamsg_error_code_id", condition=Q(error_code__isnull=False)
            ),
            models.Index(
                fields=["phone"],
                name="wamsg_phone_prefix_known",
                opclasses=["varchar_pattern_ops"],
                condition=~Q(phone=""),
            ),
        ]


class BounceType(models.TextChoices):
    HARD = "hard", _("hard")
    SOFT = "soft", _("soft")


class EmailMessage(CampaignMessage):
    """One campaign email to one customer: claimed, sent once, then opened/clicked, bounced or blocked."""

    class Status(models.TextChoices):
        QUEUED = "queued", _("queued")
        SENDING = "sending", _("sending")
        SENT = "sent", _("sent")
        BOUNCED = "bounced", _("bounced")
        # Refused by the receiving server's policy (blocklist, reputation, content): says nothing
        # of the address, which is not suppressed.
        BLOCKED = "blocked", _("blocked")
        FAILED = "failed", _("failed")
        SKIPPED = "skipped", _("skipped")
        CANCELLED = "cancelled", _("cancelled")
        HELD_OUT = "held_out", _("held out (control)")

    FINAL = (
        Status.SENT,
        Status.BOUNCED,
        Status.BLOCKED,
        Status.FAILED,
        Status.SKIPPED,
        Status.CANCELLED,
        Status.HELD_OUT,
    )
    IN_FLIGHT = (Status.QUEUED, Status.SENDING)

    # No index of their own: the composite indexes lead with them (one index less to write per
    # message on the busiest tables). No database constraint either (see MESSAGE_FKS).
    campaign = models.ForeignKey(
        "campaigns.Campaign",
        on_delete=models.CASCADE,
        related_name="email_messages",
        verbose_name=_("campaign"),
        db_index=False,
        db_constraint=False,
    )
    customer = models.ForeignKey(
        Customer,
        on_delete=models.CASCADE,
        related_name="email_messages",
        verbose_name=_("customer"),
        db_index=False,
        db_constraint=False,
    )
    status = models.CharField(_("status"), max_length=10, choices=Status.choices, default=Status.QUEUED)
    email = models.EmailField(_("address"), blank=True, default="")
    smtp_reply = models.TextField(_("server reply"), blank=True, default="")
    # Set when sent through an ESP (django-anymail): its tracking webhooks name the message by it.
    esp_message_id = models.CharField(  # noqa: DJ001 - NULL until sent, unique once set
        _("provider message id"), max_length=255, null=True, blank=True
    )
    bounce_type = models.CharField(
        _("bounce type"), max_length=4, choices=BounceType.choices, blank=True, default=""
    )
    bounce_message = models.TextField(_("bounce message"), blank=True, default="")
    # A soft-bounced message is not claimed again before this (kept in the row, so the backoff
    # holds across the job's runs, its yields and a recovery).
    retry_at = models.DateTimeField(_("next attempt not before"), null=True, blank=True)
    opened_at = models.DateTimeField(_("opened at"), null=True, blank=True)

    class Meta:
        verbose_name = _("email message")
        verbose_name_plural = _("email messages")
        constraints = [
            *message_constraints("emmsg", once_per_campaign="email_message_once_per_campaign"),
            # An ESP tracking event's message (campaigns.esp_tracking), the admin's search by it.
            models.UniqueConstraint(
                fields=["esp_message_id"],
                name="emmsg_esp_message_id_unique",
                condition=Q(esp_message_id__isnull=False),
            ),
        ]
        indexes = [
            *message_indexes("emmsg"),
            # The admin's search by address in any case (`iexact`).
            models.Index(Upper("email"), name="emmsg_email_upper_known", condition=~Q(email="")),
        ]


class TestSend(models.Model):
    """A campaign sent to its manager before it starts ("send this campaign to me"), with a chosen
    customer's variables: recorded here, never a campaign message (no count, no cost, no cap)."""

    __test__ = False  # its name is not a test class's (pytest collected it wherever it was imported)

    class Status(models.TextChoices):
        QUEUED = "queued", _("queued")
        SENDING = "sending", _("sending")
        SENT = "sent", _("sent")
        FAILED = "failed", _("failed")

    campaign = models.ForeignKey(
        "campaigns.Campaign", on_delete=models.CASCADE, related_name="test_sends", verbose_name=_("campaign")
    )
    customer = models.ForeignKey(
        Customer, on_delete=models.SET_NULL, null=True, related_name="+", verbose_name=_("variables of")
    )
    to = models.CharField(_("sent to"), max_length=254)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        related_name="+",
        verbose_name=_("requested by"),
    )
    status = models.CharField(_("status"), max_length=8, choices=Status.choices, default=Status.QUEUED)
    wamid = models.CharField(_("WhatsApp message id"), max_length=128, blank=True, default="")
    error = models.TextField(_("error"), blank=True, default="")
    created_at = models.DateTimeField(_("created at"), default=dj_timezone.now)
    sent_at = models.DateTimeField(_("sent at"), null=True, blank=True)

    class Meta:
        verbose_name = _("test send")
        verbose_name_plural = _("test sends")
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.campaign_id} → {self.to}"
