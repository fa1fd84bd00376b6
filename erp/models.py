"""An organization's ERP (Linx Millennium) connection and sync state, and the records it could not read."""

from __future__ import annotations

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone as dj_timezone
from django.utils.translation import gettext_lazy as _

from crm import crypto
from crm.models import Organization, Store
from erp.reasons import reason_text
from integrations.outbound import validate_outbound_url

_PASSWORD_CONTEXT = "erp.ErpConnection.password"  # noqa: S105 - a label, not a secret


class ErpConnection(models.Model):
    """Where an organization's Millennium server is, how to log in (password encrypted at rest),
    and how far the customer sync has got."""

    organization = models.OneToOneField(
        Organization, on_delete=models.CASCADE, related_name="erp_connection", verbose_name=_("organization")
    )
    base_url = models.URLField(
        _("Millennium URL"),
        help_text=_("e.g. https://erp.example.com.br"),
        validators=[validate_outbound_url],
    )
    username = models.CharField(_("username"), max_length=150)
    password_encrypted = models.TextField(_("password (encrypted)"), editable=False, default="")
    page_size = models.PositiveIntegerField(
        _("page size"),
        default=1000,
        validators=[MinValueValidator(1), MaxValueValidator(5000)],
        help_text=_("Records asked per request ($top)."),
    )
    timeout_seconds = models.PositiveSmallIntegerField(
        _("timeout (seconds)"),
        default=30,
        validators=[MinValueValidator(1), MaxValueValidator(600)],
        help_text=_("How long to wait for one page before giving up (and retrying later)."),
    )
    enabled = models.BooleanField(_("enabled"), default=True)
    # Every customer with a trans_id up to this one has been synced: incremental syncs ask for
    # what comes after it. Written in the same transaction as the page it covers.
    customers_trans_id = models.BigIntegerField(_("customers high-water trans_id"), default=0)
    # The full sync in progress (started on customers_full_day) has synced everything up to
    # this trans_id; a crashed run resumes here. NULL when no full sync is in progress.
    customers_full_cursor = models.BigIntegerField(_("full sync position (trans_id)"), null=True, blank=True)
    customers_full_day = models.DateField(_("full sync in progress of"), null=True, blank=True)
    customers_full_synced_at = models.DateTimeField(_("last full customer sync"), null=True, blank=True)
    customers_synced_at = models.DateTimeField(_("last customer sync"), null=True, blank=True)
    sales_synced_at = models.DateTimeField(_("last sales sync"), null=True, blank=True)
    last_error = models.TextField(_("last error"), blank=True, default="")
    last_error_at = models.DateTimeField(_("last error at"), null=True, blank=True)
    created_at = models.DateTimeField(_("created at"), default=dj_timezone.now, editable=False)

    class Meta:
        verbose_name = _("ERP connection")
        verbose_name_plural = _("ERP connections")

    def __str__(self) -> str:
        return f"{self.organization} → {self.base_url}"

    def set_password(self, password: str) -> None:
        self.password_encrypted = crypto.encrypt(password, context=_PASSWORD_CONTEXT)

    def get_password(self) -> str:
        """Decrypted in memory only; never put it in a job payload, a log line or Redis."""
        return crypto.decrypt(self.password_encrypted, context=_PASSWORD_CONTEXT)


crypto.register_encrypted_field("erp.ErpConnection", "password_encrypted", _PASSWORD_CONTEXT)


class ErpSyncIssue(models.Model):
    """An ERP record a sync could not read and skipped. One row per distinct problem: seeing the
    same broken record again only moves `seen_at` and counts it."""

    class Kind(models.TextChoices):
        CUSTOMER = "customer", _("customer")
        SALE = "sale", _("sale")

    organization = models.ForeignKey(
        Organization, on_delete=models.CASCADE, related_name="erp_sync_issues", verbose_name=_("organization")
    )
    store = models.ForeignKey(
        Store,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="erp_sync_issues",
        verbose_name=_("store"),
    )
    kind = models.CharField(_("kind"), max_length=10, choices=Kind.choices)
    external_id = models.CharField(_("ERP id"), max_length=64, blank=True, default="")
    trans_id = models.BigIntegerField(_("trans_id"), null=True, blank=True)
    reason = models.CharField(_("reason"), max_length=300)  # in English; shown by `reason_shown`
    # The reason as a message id and its values (erp.reasons), so each reader sees it in their own
    # language; "" for a reason without one (an issue from before, read back by its shape).
    reason_code = models.CharField(_("reason (message id)"), max_length=200, blank=True, default="")
    reason_params = models.JSONField(_("reason (values)"), default=dict, blank=True)
    payload = models.TextField(_("record (excerpt)"), blank=True, default="")
    fingerprint = models.CharField(_("fingerprint"), max_length=64, editable=False)
    first_seen_at = models.DateTimeField(_("first seen at"), default=dj_timezone.now)
    seen_at = models.DateTimeField(_("last seen at"), default=dj_timezone.now)
    times_seen = models.PositiveIntegerField(_("times seen"), default=1)

    class Meta:
        verbose_name = _("ERP sync issue")
        verbose_name_plural = _("ERP sync issues")
        ordering = ["-seen_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["organization", "kind", "fingerprint"], name="erp_sync_issue_unique_fingerprint"
            ),
        ]
        indexes = [models.Index(fields=["organization", "seen_at"], name="erp_sync_issue_org_seen")]

    def __str__(self) -> str:
        return f"{self.kind} {self.external_id or '?'}: {self.reason_shown()}"

    def reason_shown(self) -> str:
        """The reason in the active language."""
        return reason_text(code=self.reason_code, params=self.reason_params, english=self.reason)
