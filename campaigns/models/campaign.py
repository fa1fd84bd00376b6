"""A campaign: its content, audience, schedule and status, and its metrics row."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone as dj_timezone
from django.utils.translation import gettext_lazy as _

from campaigns.models.messages import EmailMessage, WhatsappMessage
from campaigns.models.segments import Segment
from crm.models import SINGLE_LINE, Organization, Store
from integrations.models import PriceCategory


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
    template_category = models.CharField(
        _("template category"), max_length=20, default="marketing", choices=PriceCategory.choices
    )
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
