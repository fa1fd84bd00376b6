"""What campaigns sold: attributed sales, revenue rollups and the lift's sales."""

from __future__ import annotations

from decimal import Decimal

from django.db import models
from django.db.models.functions import Now
from django.utils.translation import gettext_lazy as _

from campaigns.models.campaign import Campaign, Channel
from crm.models import Organization, Sale, Store


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
