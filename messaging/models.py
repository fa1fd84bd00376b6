"""What every sender keeps about an address: the organization's email suppression list."""

from __future__ import annotations

from django.db import models
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
