"""Customers' daily RFM segments and the movements between snapshots (rules: campaigns.segments)."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from crm.models import Customer, Organization


class Segment(models.TextChoices):
    CHAMPIONS = "champions", _("champions")
    LOYAL = "loyal", _("loyal")
    PROMISING = "promising", _("promising")
    NEW = "new", _("new")
    NEED_ATTENTION = "need_attention", _("need attention")
    ABOUT_TO_SLEEP = "about_to_sleep", _("about to sleep")
    AT_RISK = "at_risk", _("at risk")
    HIBERNATING = "hibernating", _("hibernating")
    LOST = "lost", _("lost")


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
