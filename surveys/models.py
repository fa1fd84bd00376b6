"""Post-sale surveys: one per sale, sent N days after it, answered once on a public page."""

from __future__ import annotations

import secrets

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone as dj_timezone
from django.utils.translation import gettext_lazy as _

from crm.models import Customer, Organization, Sale, Store

SCORE_MIN, SCORE_MAX = 0, 10
COMMENT_MAX = 2000
# Given to a survey whose worker stopped while sending it: the message may or may not have gone
# out, so it is never sent again (a second survey is worse than a missing one).
OUTCOME_UNKNOWN = "outcome unknown: the send was interrupted; not resent"


def _token() -> str:
    return secrets.token_urlsafe(16)


class Survey(models.Model):
    class Channel(models.TextChoices):
        EMAIL = "email", _("email")
        WHATSAPP = "whatsapp", _("WhatsApp")

    class Status(models.TextChoices):
        SCHEDULED = "scheduled", _("scheduled")
        SENDING = "sending", _("sending")
        SENT = "sent", _("sent")
        ANSWERED = "answered", _("answered")
        SKIPPED = "skipped", _("skipped")
        FAILED = "failed", _("failed")
        CANCELLED = "cancelled", _("cancelled")

    # What counts as "surveyed" for the cool-down.
    SURVEYED = (Status.SENT, Status.ANSWERED)

    # The composite indexes below start with these columns: no single-column index of their own.
    organization = models.ForeignKey(
        Organization,
        on_delete=models.CASCADE,
        related_name="surveys",
        verbose_name=_("organization"),
        db_index=False,
    )
    sale = models.OneToOneField(Sale, on_delete=models.CASCADE, related_name="survey", verbose_name=_("sale"))
    customer = models.ForeignKey(
        Customer, on_delete=models.CASCADE, related_name="surveys", verbose_name=_("customer"), db_index=False
    )
    store = models.ForeignKey(
        Store, on_delete=models.CASCADE, related_name="surveys", verbose_name=_("store")
    )
    channel = models.CharField(_("channel"), max_length=10, choices=Channel.choices)
    status = models.CharField(_("status"), max_length=10, choices=Status.choices, default=Status.SCHEDULED)
    due_at = models.DateTimeField(_("due at"))
    # Random, signed in links (surveys.links): the credential of the public page.
    token = models.CharField(_("link token"), max_length=32, unique=True, default=_token, editable=False)
    attempts = models.PositiveSmallIntegerField(_("attempts"), default=0)
    sending_at = models.DateTimeField(_("claimed for sending at"), null=True, blank=True)
    sent_at = models.DateTimeField(_("sent at"), null=True, blank=True)
    provider_reference = models.CharField(
        _("provider reference"),
        max_length=255,
        blank=True,
        default="",
        help_text=_("Meta's message id or the mail server's answer."),
    )
    reason = models.TextField(_("skip or error reason"), blank=True, default="")
    answered_at = models.DateTimeField(_("answered at"), null=True, blank=True)
    score = models.PositiveSmallIntegerField(
        _("score"),
        null=True,
        blank=True,
        validators=[MinValueValidator(SCORE_MIN), MaxValueValidator(SCORE_MAX)],
    )
    comment = models.TextField(_("comment"), max_length=COMMENT_MAX, blank=True, default="")
    created_at = models.DateTimeField(_("created at"), default=dj_timezone.now, editable=False)

    class Meta:
        verbose_name = _("survey")
        verbose_name_plural = _("surveys")
        ordering = ["-due_at"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(score__isnull=True) | models.Q(score__gte=SCORE_MIN, score__lte=SCORE_MAX),
                name="survey_score_0_10",
            ),
        ]
        indexes = [
            models.Index(fields=["status", "due_at"], name="survey_status_due"),
            # The cool-down: a customer's most recent survey sent.
            models.Index(fields=["customer", "sent_at"], name="survey_customer_sent"),
            # The NPS report: an organization's answers by time.
            models.Index(fields=["organization", "answered_at"], name="survey_org_answered"),
        ]

    def __str__(self) -> str:
        return f"#{self.pk} · {self.get_status_display()}"
