"""Campaigns, their metrics and their messages (one row per campaign and recipient)."""

from __future__ import annotations

import secrets
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now, Upper
from django.utils import timezone as dj_timezone
from django.utils.translation import gettext_lazy as _

from campaigns.segments import Segment
from crm.models import SINGLE_LINE, Customer, Organization, Sale, Store


class Channel(models.TextChoices):
    WHATSAPP = "whatsapp", _("WhatsApp")
    EMAIL = "email", _("email")


class Sender(models.TextChoices):
    """Which number a WhatsApp campaign's message is sent from."""

    CAMPAIGN = "campaign", _("the campaign's number")
    STORE = "store", _("the customer's store number")


class BodyFormat(models.TextChoices):
    MJML = "mjml", _("MJML")
    HTML = "html", _("HTML")


# What a recipient received: once a campaign has started, none of it changes (history is history).
CONTENT_FIELDS = (
    "channel",
    "whatsapp_number",
    "sender",
    "template_name",
    "template_language",
    "template_category",
    "template_variables",
    "header_image_url",
    "redirect_url",
    "redirect_button_index",
    "unsubscribe_button_index",
    "email_subject",
    "email_body_format",
    "email_body",
    "audience_store",
    "audience_purchased_within_days",
    "audience_segment",
    "control_percent",
    "audience_filter",
)

# The audience's purchase window: a hundred years covers any real one; more would overflow the date
# arithmetic (a start before year 1) and fail the campaign's page and its fan-out.
AUDIENCE_MAX_DAYS = 36_500
CONTROL_MAX_PERCENT = 50


class Kind(models.TextChoices):
    CAMPAIGN = "campaign", _("campaign")
    FLOW = "flow", _("flow step")


class Campaign(models.Model):
    class Status(models.TextChoices):
        DRAFT = "draft", _("draft")
        SCHEDULED = "scheduled", _("scheduled")
        SENDING = "sending", _("sending")
        PAUSED = "paused", _("paused")
        SENT = "sent", _("sent")
        CANCELLED = "cancelled", _("cancelled")
        STOPPED = "stopped", _("stopped (provider error)")
        RECURRING = "recurring", _("recurring (active)")

    class Misfire(models.TextChoices):
        ONCE = "once", _("send once when back")
        SKIP = "skip", _("skip it")

    organization = models.ForeignKey(
        Organization, on_delete=models.CASCADE, related_name="campaigns", verbose_name=_("organization")
    )
    name = models.CharField(_("name"), max_length=200)
    channel = models.CharField(_("channel"), max_length=10, choices=Channel.choices, default=Channel.WHATSAPP)
    status = models.CharField(_("status"), max_length=12, choices=Status.choices, default=Status.DRAFT)
    # WhatsApp
    whatsapp_number = models.ForeignKey(
        "integrations.WhatsappNumber",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="campaigns",
        verbose_name=_("WhatsApp number"),
    )
    sender = models.CharField(
        _("send from"),
        max_length=10,
        choices=Sender.choices,
        default=Sender.CAMPAIGN,
        help_text=_(
            "The customer's store number: each message goes from the WhatsApp number of the store of "
            "the customer's latest sale, or from the number above when that store has none (or the "
            "customer has no sale). Chosen when the campaign starts."
        ),
    )
    template_name = models.CharField(_("template name"), max_length=512, blank=True, default="")
    template_language = models.CharField(_("template language"), max_length=10, default="pt_BR")
    template_category = models.CharField(_("template category"), max_length=20, default="marketing")
    template_variables = models.JSONField(
        _("template variables"),
        default=list,
        blank=True,
        help_text=_(
            "Body variables {{1}}, {{2}}… in order, each a customer field: first_name, name, email, "
            "store_name."
        ),
    )
    header_image_url = models.URLField(_("header image URL"), blank=True, default="")
    redirect_url = models.URLField(_("redirect button target"), blank=True, default="")
    redirect_button_index = models.PositiveSmallIntegerField(
        _("redirect button index"), null=True, blank=True
    )
    unsubscribe_button_index = models.PositiveSmallIntegerField(
        _("unsubscribe button index"), null=True, blank=True
    )
    # Email
    email_subject = models.CharField(
        _("email subject"),
        max_length=255,
        blank=True,
        default="",
        help_text=_("May use {{ first_name }}, {{ name }}, {{ email }}, {{ store_name }}."),
        validators=[SINGLE_LINE],
    )
    email_body_format = models.CharField(
        _("email body format"), max_length=4, choices=BodyFormat.choices, default=BodyFormat.MJML
    )
    email_body = models.TextField(
        _("email body"),
        blank=True,
        default="",
        help_text=_(
            "MJML (compiled to HTML) or HTML. Variables: {{ first_name }}, {{ name }}, {{ email }}, "
            "{{ store_name }}, {{ unsubscribe_url }}. Links are click-tracked; an open pixel is added."
        ),
    )
    # Audience
    audience_store = models.ForeignKey(
        Store,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name=_("only customers of store"),
    )
    audience_purchased_within_days = models.PositiveIntegerField(
        _("only customers who bought in the last N days"),
        null=True,
        blank=True,
        validators=[MaxValueValidator(AUDIENCE_MAX_DAYS)],
    )
    audience_segment = models.CharField(
        _("only customers in segment"),
        max_length=20,
        blank=True,
        default="",
        choices=Segment.choices,
        help_text=_("The customers in this RFM segment in the organization's latest segment snapshot."),
    )
    # Recurrence: an active recurring campaign is a template; each occurrence is a campaign of its own
    recurrence = models.CharField(
        _("recurrence (cron)"),
        max_length=100,
        blank=True,
        default="",
        help_text=_(
            "A cron expression in the organization's time zone, e.g. '0 9 * * 1' (Mondays 09:00). "
            "Activate it with the action 'Activate recurrence'."
        ),
    )
    recurrence_misfire = models.CharField(
        _("an occurrence missed while the system was down"),
        max_length=4,
        choices=Misfire.choices,
        default=Misfire.ONCE,
    )
    recurrence_until = models.DateTimeField(_("last run considered"), null=True, blank=True, editable=False)
    parent = models.ForeignKey(
        "self",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="occurrences",
        verbose_name=_("recurring campaign"),
    )
    occurrence_at = models.DateTimeField(_("occurrence"), null=True, blank=True, editable=False)
    # Life
    scheduled_at = models.DateTimeField(_("scheduled for"), null=True, blank=True)
    started_at = models.DateTimeField(_("started at"), null=True, blank=True)
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)
    stop_reason = models.TextField(_("stop reason"), blank=True, default="")
    # The tracked links' targets as they were when the campaign started: {"redirect_url": str,
    # "email": [str, ...]}. A delivered link goes there whatever happens to the campaign later.
    sent_links = models.JSONField(_("link targets when sent"), null=True, blank=True, editable=False)
    # Hidden from the default list; its messages and credited sales stay (a campaign that sent is
    # archived, never deleted, by a manager).
    archived_at = models.DateTimeField(_("archived at"), null=True, blank=True, editable=False)
    created_at = models.DateTimeField(_("created at"), default=dj_timezone.now, editable=False)
    # Incrementality (campaigns.lift): this share of the recipients, drawn at random after consent,
    # opt-outs and contact caps, is held out (a message row `held_out`, nothing sent).
    control_percent = models.PositiveSmallIntegerField(
        _("control group (%)"),
        default=0,
        validators=[MaxValueValidator(CONTROL_MAX_PERCENT)],
        help_text=_(
            "0-50% of the recipients, drawn at random, are not sent the campaign: comparing their "
            "purchases with the others' shows what the campaign really caused (the lift report)."
        ),
    )
    # A flow step's campaign (flows.models.StepCampaign) carries that step's messages: it stays
    # `sending` while the flow lives (never completed), and a transactional flow's is exempt from
    # the contact caps (never from consent or opt-outs).
    kind = models.CharField(_("kind"), max_length=10, choices=Kind.choices, default=Kind.CAMPAIGN)
    caps_exempt = models.BooleanField(_("exempt from contact caps"), default=False, editable=False)
    # The audience's customer filter (crm.customer_filters.CustomerFilter.to_json), with the fields above.
    audience_filter = models.JSONField(_("audience filter"), default=dict, blank=True)

    class Meta:
        verbose_name = _("campaign")
        verbose_name_plural = _("campaigns")
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["organization", "status"], name="campaign_org_status")]
        constraints = [
            models.UniqueConstraint(fields=["parent", "occurrence_at"], name="campaign_occurrence_once"),
            models.CheckConstraint(
                condition=Q(audience_purchased_within_days__lte=AUDIENCE_MAX_DAYS),
                name="campaign_audience_days_range",
            ),
            models.CheckConstraint(
                condition=Q(control_percent__lte=CONTROL_MAX_PERCENT), name="campaign_control_percent_range"
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def save(self, *args: Any, **kwargs: Any) -> None:
        """Refuses to change the content of a campaign that has started, whatever the path (admin,
        a service, a shell): ValidationError."""
        update_fields = kwargs.get("update_fields")
        if update_fields is None or set(update_fields) & _CONTENT_COLUMNS:
            changed = self.content_changes()
            if changed:
                raise ValidationError(
                    _("A campaign that has started cannot change what it sent: %(fields)s")
                    % {"fields": ", ".join(changed)}
                )
        super().save(*args, **kwargs)

    def clean(self) -> None:
        super().clean()
        changed = self.content_changes()
        if changed:
            raise ValidationError(
                dict.fromkeys(changed, _("A campaign that has started cannot change what it sent."))
            )

    @property
    def content_locked(self) -> bool:
        """Has it started (sending, paused, sent, stopped, or cancelled after starting)? Then its
        content is what recipients received and cannot change."""
        return self.started_at is not None or self.status in (
            self.Status.SENDING,
            self.Status.PAUSED,
            self.Status.SENT,
            self.Status.STOPPED,
        )

    def content_changes(self) -> list[str]:
        """The content fields this instance changes on a campaign that has started (its stored row);
        [] when it has not started or nothing changed."""
        if self.pk is None:
            return []
        columns = list(CONTENT_COLUMNS)
        stored = type(self).objects.filter(pk=self.pk).values(*columns, "status", "started_at").first()
        if stored is None:
            return []
        before = type(self)(status=stored["status"], started_at=stored["started_at"])
        if not before.content_locked:
            return []
        return [
            name
            for name, column in zip(CONTENT_FIELDS, columns, strict=True)
            if getattr(self, column) != stored[column]
        ]

    @property
    def message_model(self) -> type[WhatsappMessage] | type[EmailMessage]:
        """The model holding this campaign's messages (one row per recipient)."""
        return EmailMessage if self.channel == Channel.EMAIL else WhatsappMessage


def _attname(name: str) -> str:
    field = Campaign._meta.get_field(name)
    assert isinstance(field, models.Field)
    return field.attname


# The same, as the model's attribute names (whatsapp_number_id…): what a recurring copy copies too.
CONTENT_COLUMNS = tuple(_attname(name) for name in CONTENT_FIELDS)
_CONTENT_COLUMNS = {*CONTENT_FIELDS, *CONTENT_COLUMNS}


class CampaignMetric(models.Model):
    """Counters, always updated with F() so concurrent workers never lose an increment."""

    campaign = models.OneToOneField(
        Campaign, on_delete=models.CASCADE, related_name="metric", verbose_name=_("campaign")
    )
    queued = models.PositiveIntegerField(_("recipients"), default=0)
    sent = models.PositiveIntegerField(_("sent"), default=0)
    delivered = models.PositiveIntegerField(_("delivered"), default=0)
    read = models.PositiveIntegerField(_("read"), default=0)
    failed = models.PositiveIntegerField(_("failed"), default=0)
    skipped = models.PositiveIntegerField(_("skipped"), default=0)
    clicked = models.PositiveIntegerField(_("clicked"), default=0)
    opened = models.PositiveIntegerField(_("opened"), default=0)
    bounced = models.PositiveIntegerField(_("bounced"), default=0)
    blocked = models.PositiveIntegerField(_("blocked"), default=0)
    # WhatsApp messages whose send may or may not have reached Meta (see WhatsappMessage.Status.UNKNOWN).
    unknown = models.PositiveIntegerField(_("outcome unknown"), default=0)
    cost = models.DecimalField(_("cost"), max_digits=14, decimal_places=6, default=Decimal("0"))
    # ISO 4217 of `cost`: the rate card's when the campaign started (one currency per total).
    cost_currency = models.CharField(_("cost currency"), max_length=3, default="USD")

    class Meta:
        verbose_name = _("campaign metric")
        verbose_name_plural = _("campaign metrics")

    def __str__(self) -> str:
        return f"{self.campaign_id}: {self.sent}/{self.queued}"


# The reason given to a message whose worker died after claiming it: the provider may or may not
# have accepted it, so it is never sent again (a retry of failed messages leaves it alone). A
# WhatsApp message keeps it as its error_reason in the UNKNOWN status; an email is FAILED with it.
OUTCOME_UNKNOWN = "outcome unknown: the worker stopped during the send; not resent"


def _token() -> str:
    return secrets.token_urlsafe(16)


# Message rows are written a million at a time by the fan-out (campaigns.services), so they carry
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
        # The per-customer message limit and conflict block (campaigns.sending), and deleting a
        # customer's messages.
        models.Index(fields=["customer", "sent_at"], name=f"{prefix}_customer_sent"),
        # Messages stuck in sending (services.reconcile_in_flight).
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
        return f"{self.campaign_id}/{self.customer_id} {self.status}"


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
        Campaign,
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
        Campaign,
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


class CustomerSegment(models.Model):
    """A customer's RFM segment in one daily snapshot (see campaigns.segments for the rules)."""

    # Rows are derived from sales, whose own foreign keys guarantee the customer exists, and a
    # snapshot inserts up to a million at once: database-level checks would cost two trigger calls
    # per row at commit (~40% of the snapshot). Deleting a customer or an organization through
    # Django still deletes its rows (on_delete=CASCADE is the ORM's).
    organization = models.ForeignKey(
        Organization,
        on_delete=models.CASCADE,
        related_name="+",
        db_index=False,  # the unique constraint and the index below both start with it
        db_constraint=False,
        verbose_name=_("organization"),
    )
    day = models.DateField(_("day"))
    customer = models.ForeignKey(
        Customer,
        on_delete=models.CASCADE,
        related_name="segments",
        db_constraint=False,
        verbose_name=_("customer"),
    )
    segment = models.CharField(_("segment"), max_length=20, choices=Segment.choices)
    recency_days = models.PositiveIntegerField(_("days since the last sale"))
    frequency = models.PositiveIntegerField(_("sales in 365 days"))
    monetary = models.DecimalField(_("total in 365 days"), max_digits=14, decimal_places=2)
    # 1-5 among the organization's active customers; empty for the lost (no sale in 365 days).
    r_score = models.PositiveSmallIntegerField(_("R"), null=True, blank=True)
    f_score = models.PositiveSmallIntegerField(_("F"), null=True, blank=True)
    m_score = models.PositiveSmallIntegerField(_("M"), null=True, blank=True)

    class Meta:
        verbose_name = _("customer segment")
        verbose_name_plural = _("customer segments")
        constraints = [
            models.UniqueConstraint(
                fields=["organization", "day", "customer"], name="customer_segment_once_per_day"
            ),
        ]
        indexes = [models.Index(fields=["organization", "day", "segment"], name="custseg_org_day_segment")]

    def __str__(self) -> str:
        return f"{self.customer_id} {self.day} {self.segment}"


class SegmentMovement(models.Model):
    """How many customers went from one segment to another between two consecutive snapshots.

    An empty `from_segment` means not in the previous snapshot (a first sale, or the first
    snapshot); an empty `to_segment` means no longer in this one.
    """

    organization = models.ForeignKey(
        Organization,
        on_delete=models.CASCADE,
        related_name="+",
        db_index=False,
        verbose_name=_("organization"),
    )
    day = models.DateField(_("day"))
    previous_day = models.DateField(_("previous snapshot"), null=True, blank=True)
    from_segment = models.CharField(_("from"), max_length=20, blank=True, choices=Segment.choices)
    to_segment = models.CharField(_("to"), max_length=20, blank=True, choices=Segment.choices)
    customers = models.PositiveIntegerField(_("customers"))

    class Meta:
        verbose_name = _("segment movement")
        verbose_name_plural = _("segment movements")
        constraints = [
            models.UniqueConstraint(
                fields=["organization", "day", "from_segment", "to_segment"], name="segment_movement_unique"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.day} {self.from_segment or '∅'} -> {self.to_segment or '∅'}: {self.customers}"


class SaleAttribution(models.Model):
    """The campaign message a sale is attributed to (campaigns.attribution): the last one sent to
    its customer before the sale, within the organization's attribution window. One row per sale;
    a sale without such a message has none."""

    # The sale is the key: the unique constraint that makes each sale count once.
    sale = models.OneToOneField(
        Sale, on_delete=models.CASCADE, primary_key=True, related_name="attribution", verbose_name=_("sale")
    )
    campaign = models.ForeignKey(
        Campaign,
        on_delete=models.CASCADE,
        related_name="attributions",
        verbose_name=_("campaign"),
        db_index=False,  # the (campaign) INCLUDE (total) index below
    )
    # Copied from the sale in the statement that reads it, for the reads that must not join the
    # sales (the organization's days, per store): the sale's own foreign keys guarantee them, so no
    # database constraint (a check per row); a store is PROTECTed by its sales, so never deleted under one.
    organization = models.ForeignKey(
        Organization,
        on_delete=models.CASCADE,
        related_name="+",
        verbose_name=_("organization"),
        db_index=False,
        db_constraint=False,
    )
    store = models.ForeignKey(
        Store,
        on_delete=models.DO_NOTHING,
        related_name="+",
        verbose_name=_("store"),
        db_index=False,
        db_constraint=False,
    )
    total = models.DecimalField(_("total"), max_digits=12, decimal_places=2)
    sold_at = models.DateTimeField(_("sold at"))
    channel = models.CharField(_("channel"), max_length=10, choices=Channel.choices)
    message_id = models.BigIntegerField(_("message id"))  # in the channel's message table
    message_sent_at = models.DateTimeField(_("message sent at"))
    attributed_at = models.DateTimeField(_("attributed at"), db_default=Now())

    class Meta:
        verbose_name = _("sale attribution")
        verbose_name_plural = _("sale attributions")
        indexes = [
            # A campaign's figures counted from the rows (the rollup's check) and deleting a campaign's rows.
            models.Index(fields=["campaign"], include=["total"], name="saleattr_campaign"),
            # The organization's attributed sales in a period, per store (campaigns.dashboards).
            models.Index(
                fields=["organization", "sold_at"], include=["store", "total"], name="saleattr_org_sold_at"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.sale_id} → {self.campaign_id}"


class CampaignRevenue(models.Model):
    """A campaign's attributed revenue and conversions (attributed sales), kept by PostgreSQL
    triggers on SaleAttribution (migration 0012): every insert, update and delete of an attribution,
    whoever makes it (the attribution statement, a sale or campaign deleted through the ORM), adds
    its difference here in the same transaction. Read it; never write it."""

    campaign = models.OneToOneField(
        Campaign,
        on_delete=models.CASCADE,
        primary_key=True,
        related_name="attributed",
        verbose_name=_("campaign"),
    )
    revenue = models.DecimalField(_("revenue"), max_digits=16, decimal_places=2, default=Decimal("0"))
    conversions = models.IntegerField(_("conversions"), default=0)

    class Meta:
        verbose_name = _("campaign revenue")
        verbose_name_plural = _("campaign revenues")

    def __str__(self) -> str:
        return f"{self.campaign_id}: {self.revenue} / {self.conversions}"


class LiftSale(models.Model):
    """A sale in the purchase window of a campaign with a control group, per arm (campaigns.lift):
    the rollup its lift report reads, written as sales are written (the "sales written" hook). A
    sale counts once per campaign whose message (sent, or held out) its customer had in the
    window before it; unlike attribution it may count for several campaigns, each its own
    experiment."""

    campaign = models.ForeignKey(
        Campaign, on_delete=models.CASCADE, related_name="+", verbose_name=_("campaign"), db_index=False
    )
    sale = models.ForeignKey(Sale, on_delete=models.CASCADE, related_name="+", verbose_name=_("sale"))
    customer_id = models.BigIntegerField(_("customer"))
    control = models.BooleanField(_("control group"))
    total = models.DecimalField(_("total"), max_digits=12, decimal_places=2)

    class Meta:
        verbose_name = _("lift sale")
        verbose_name_plural = _("lift sales")
        constraints = [
            models.UniqueConstraint(fields=["campaign", "sale"], name="liftsale_once_per_campaign")
        ]
        indexes = [
            # The report: per arm and customer, index-only.
            models.Index(
                fields=["campaign", "control", "customer_id"], include=["total"], name="liftsale_report"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.campaign_id}/{self.sale_id} {'control' if self.control else 'treatment'}"


class TestSend(models.Model):
    """A campaign sent to its manager before it starts ("send this campaign to me"), with a chosen
    customer's variables: recorded here, never a campaign message (no count, no cost, no cap)."""

    class Status(models.TextChoices):
        QUEUED = "queued", _("queued")
        SENDING = "sending", _("sending")
        SENT = "sent", _("sent")
        FAILED = "failed", _("failed")

    campaign = models.ForeignKey(
        Campaign, on_delete=models.CASCADE, related_name="test_sends", verbose_name=_("campaign")
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
