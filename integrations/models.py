"""Per-organization settings of the external systems. Secrets are stored encrypted (crm.crypto)."""

from __future__ import annotations

from decimal import Decimal

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone as dj_timezone
from django.utils.translation import gettext_lazy as _
from django.utils.translation import pgettext_lazy

from crm import crypto
from crm.models import E164, SINGLE_LINE, Organization, Store
from integrations.outbound import validate_outbound_host, validate_outbound_url

_TOKEN_CONTEXT = "integrations.WhatsappNumber.access_token"  # noqa: S105 - a label, not a secret


class WhatsappNumber(models.Model):
    """A WhatsApp Business phone number of a store, and the credentials to send from it."""

    organization = models.ForeignKey(
        Organization,
        on_delete=models.CASCADE,
        related_name="whatsapp_numbers",
        verbose_name=_("organization"),
    )
    store = models.ForeignKey(
        Store,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="whatsapp_numbers",
        verbose_name=_("store"),
    )
    display_phone_number = models.CharField(_("phone number (E.164)"), max_length=16, validators=[E164])
    phone_number_id = models.CharField(_("Meta phone number id"), max_length=64, unique=True)
    business_account_id = models.CharField(
        _("WhatsApp Business account id"), max_length=64, blank=True, default=""
    )
    access_token_encrypted = models.TextField(_("access token (encrypted)"), editable=False, default="")
    graph_url = models.URLField(
        _("Graph API base URL"),
        blank=True,
        default="",
        help_text=_("Empty: the deployment's WHATSAPP_GRAPH_URL."),
        validators=[validate_outbound_url],
    )
    messages_per_second = models.PositiveIntegerField(
        _("messages per second"),
        default=80,
        validators=[MinValueValidator(0), MaxValueValidator(1000)],
        help_text=_("Pacing of sends from this number (Meta's default tier is 80/s). 0 = no pacing."),
    )
    # Set when Meta refuses this number itself (its token, registration, quality): only its messages
    # wait until an operator clears it; the organization's other numbers go on (campaigns.whatsapp).
    paused_at = models.DateTimeField(_("sending paused at"), null=True, blank=True)
    paused_reason = models.TextField(_("pause reason"), blank=True, default="")
    created_at = models.DateTimeField(_("created at"), default=dj_timezone.now, editable=False)

    class Meta:
        verbose_name = _("WhatsApp number")
        verbose_name_plural = _("WhatsApp numbers")

    def __str__(self) -> str:
        return f"{self.display_phone_number} ({self.phone_number_id})"

    def set_access_token(self, token: str) -> None:
        self.access_token_encrypted = crypto.encrypt(token, context=_TOKEN_CONTEXT)

    def get_access_token(self) -> str:
        """Decrypted in memory only; never put it in a job payload, a log line or Redis."""
        return crypto.decrypt(self.access_token_encrypted, context=_TOKEN_CONTEXT)


class TemplateCategory(models.TextChoices):
    """Meta's template categories as Meta names them (a category Meta adds later shows as sent)."""

    MARKETING = "MARKETING", _("marketing")
    UTILITY = "UTILITY", _("utility")
    AUTHENTICATION = "AUTHENTICATION", _("authentication")
    SERVICE = "SERVICE", _("service")


# The rate card's categories (integrations.whatsapp.pricing.CATEGORIES): Meta's, lower-cased.
PriceCategory = models.TextChoices(  # type: ignore[call-overload]
    "PriceCategory", [(c.name, (c.value.lower(), c.label)) for c in TemplateCategory]
)


class HeaderFormat(models.TextChoices):
    TEXT = "TEXT", _("text")
    IMAGE = "IMAGE", _("image")
    VIDEO = "VIDEO", _("video")
    DOCUMENT = "DOCUMENT", _("document")
    LOCATION = "LOCATION", _("location")


class WhatsappTemplate(models.Model):
    """A message template of a WhatsApp Business account, as Meta last said it is (synced by
    integrations.services.whatsapp_templates_sync). Campaigns pick an APPROVED one."""

    class Status(models.TextChoices):
        APPROVED = "APPROVED", _("approved")
        PENDING = "PENDING", _("pending review")
        REJECTED = "REJECTED", _("rejected")
        PAUSED = "PAUSED", pgettext_lazy("a WhatsApp template's status (o modelo)", "paused")
        DISABLED = "DISABLED", _("disabled")
        IN_APPEAL = "IN_APPEAL", _("in appeal")
        DELETED = "DELETED", _("deleted")

    organization = models.ForeignKey(
        Organization,
        on_delete=models.CASCADE,
        related_name="whatsapp_templates",
        verbose_name=_("organization"),
    )
    business_account_id = models.CharField(_("WhatsApp Business account id"), max_length=64)
    meta_id = models.CharField(_("Meta template id"), max_length=64, blank=True, default="")
    name = models.CharField(_("name"), max_length=512)
    language = models.CharField(_("language"), max_length=10)
    status = models.CharField(_("status"), max_length=12, choices=Status.choices)
    category = models.CharField(
        _("category"), max_length=20, blank=True, default="", choices=TemplateCategory.choices
    )
    header_format = models.CharField(
        _("header"), max_length=16, blank=True, default="", choices=HeaderFormat.choices
    )
    header_text = models.CharField(_("header text"), max_length=200, blank=True, default="")
    body = models.TextField(_("body"), blank=True, default="")
    footer = models.TextField(_("footer"), blank=True, default="")
    # [{"index": 0, "type": "URL", "text": "Ver", "url": "https://…/{{1}}", "dynamic": true}, …]
    buttons = models.JSONField(_("buttons"), default=list, blank=True)
    variable_count = models.PositiveSmallIntegerField(_("body variables"), default=0)
    # Why our sends cannot fill it (named variables, a header variable), "" when they can.
    unsupported_reason = models.CharField(_("not usable because"), max_length=200, blank=True, default="")
    components = models.JSONField(_("components (as Meta sent them)"), default=list, blank=True)
    synced_at = models.DateTimeField(_("synced at"), default=dj_timezone.now)

    class Meta:
        verbose_name = _("WhatsApp template")
        verbose_name_plural = _("WhatsApp templates")
        ordering = ["name", "language"]
        constraints = [
            models.UniqueConstraint(
                fields=["organization", "business_account_id", "name", "language"],
                name="whatsapp_template_once",
            )
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.language})"

    @property
    def selectable(self) -> bool:
        """May a campaign choose it? Approved by Meta and fillable by our sends."""
        return self.status == self.Status.APPROVED and not self.unsupported_reason


class WhatsappPrice(models.Model):
    """Meta's rate per delivered template message, by category and recipient country (data, not code)."""

    category = models.CharField(_("category"), max_length=20, choices=PriceCategory.choices)
    country = models.CharField(_("country (ISO 3166 alpha-2, or * for any other)"), max_length=2)
    price = models.DecimalField(_("price"), max_digits=10, decimal_places=6, default=Decimal("0"))
    currency = models.CharField(_("currency"), max_length=3, default="USD")
    updated_at = models.DateTimeField(_("updated at"), auto_now=True)

    class Meta:
        verbose_name = _("WhatsApp price")
        verbose_name_plural = _("WhatsApp prices")
        constraints = [models.UniqueConstraint(fields=["category", "country"], name="whatsapp_price_unique")]

    def __str__(self) -> str:
        return f"{self.get_category_display()}/{self.country}: {self.price} {self.currency}"


_CHATWOOT_CONTEXT = "integrations.ChatwootAccount.api_token"


class ChatwootAccount(models.Model):
    """Where an organization's campaign messages are mirrored in Chatwoot (optional)."""

    class Mode(models.TextChoices):
        API_INBOX = "api_inbox", _("message in an API-channel inbox")
        PRIVATE_NOTE = "private_note", _("private note")

    organization = models.OneToOneField(
        Organization, on_delete=models.CASCADE, related_name="chatwoot", verbose_name=_("organization")
    )
    base_url = models.URLField(_("Chatwoot URL"), validators=[validate_outbound_url])
    account_id = models.PositiveIntegerField(_("account id"))
    inbox_id = models.PositiveIntegerField(
        _("inbox id"),
        help_text=_("An API-channel inbox, so Chatwoot never re-sends the message to WhatsApp."),
    )
    mode = models.CharField(_("mirror as"), max_length=20, choices=Mode.choices, default=Mode.API_INBOX)
    api_token_encrypted = models.TextField(_("API access token (encrypted)"), editable=False, default="")
    enabled = models.BooleanField(_("enabled"), default=True)

    class Meta:
        verbose_name = _("Chatwoot account")
        verbose_name_plural = _("Chatwoot accounts")

    def __str__(self) -> str:
        return f"{self.base_url} #{self.account_id}"

    def set_api_token(self, token: str) -> None:
        self.api_token_encrypted = crypto.encrypt(token, context=_CHATWOOT_CONTEXT)

    def get_api_token(self) -> str:
        """Decrypted in memory only."""
        return crypto.decrypt(self.api_token_encrypted, context=_CHATWOOT_CONTEXT)


crypto.register_encrypted_field("integrations.WhatsappNumber", "access_token_encrypted", _TOKEN_CONTEXT)
crypto.register_encrypted_field("integrations.ChatwootAccount", "api_token_encrypted", _CHATWOOT_CONTEXT)


_SMTP_CONTEXT = "integrations.EmailSettings.password"


class EmailSettings(models.Model):
    """How an organization sends email: its own SMTP server (password encrypted at rest)."""

    class Provider(models.TextChoices):
        SMTP = "smtp", _("SMTP server")
        POSTMARK = "postmark", "Postmark"
        SENDGRID = "sendgrid", "SendGrid"
        MAILGUN = "mailgun", "Mailgun"
        BREVO = "brevo", "Brevo"

    class Security(models.TextChoices):
        STARTTLS = "starttls", _("STARTTLS")
        TLS = "tls", _("implicit TLS")
        NONE = "none", _("none")

    organization = models.OneToOneField(
        Organization, on_delete=models.CASCADE, related_name="email_settings", verbose_name=_("organization")
    )
    host = models.CharField(_("SMTP host"), max_length=255, blank=True, default="")
    port = models.PositiveIntegerField(_("SMTP port"), default=587)
    security = models.CharField(
        _("security"), max_length=10, choices=Security.choices, default=Security.STARTTLS
    )
    username = models.CharField(_("username"), max_length=255, blank=True, default="")
    password_encrypted = models.TextField(_("password (encrypted)"), editable=False, default="")
    sender_name = models.CharField(_("sender name"), max_length=200, validators=[SINGLE_LINE])
    sender_email = models.EmailField(_("sender address"))
    messages_per_minute = models.PositiveIntegerField(
        _("messages per minute"),
        default=300,
        validators=[MinValueValidator(0), MaxValueValidator(100_000)],
        help_text=_("Enforced across every worker. 0 = no limit."),
    )
    unsubscribe_mailto = models.EmailField(
        _("unsubscribe mailbox"),
        blank=True,
        default="",
        help_text=_("Optional: also offered as a mailto: in the List-Unsubscribe header."),
    )
    provider = models.CharField(
        _("sent through"),
        max_length=20,
        choices=Provider.choices,
        default=Provider.SMTP,
        help_text=_("The SMTP server above, or an email service provider's API (django-anymail)."),
    )
    esp_api_key_encrypted = models.TextField(_("provider API key (encrypted)"), editable=False, default="")
    esp_api_url = models.URLField(
        _("provider API URL"),
        blank=True,
        default="",
        help_text=_("Empty: the provider's default."),
        validators=[validate_outbound_url],
    )
    # The provider account's key for its tracking webhooks' signatures (Mailgun's HTTP webhook
    # signing key, SendGrid's Signed Event Webhook verification key): per account, so kept here.
    esp_webhook_key_encrypted = models.TextField(
        _("provider webhook signing key (encrypted)"), editable=False, default=""
    )

    class Meta:
        verbose_name = _("email settings")
        verbose_name_plural = _("email settings")

    def __str__(self) -> str:
        return f"{self.sender_email} via {self.host}:{self.port}"

    def clean(self) -> None:
        super().clean()
        if self.provider == self.Provider.SMTP and self.host:
            validate_outbound_host(self.host, self.port, field="host")

    def set_password(self, password: str) -> None:
        self.password_encrypted = crypto.encrypt(password, context=_SMTP_CONTEXT) if password else ""

    def get_password(self) -> str:
        """Decrypted in memory only."""
        return (
            crypto.decrypt(self.password_encrypted, context=_SMTP_CONTEXT) if self.password_encrypted else ""
        )

    def set_esp_webhook_key(self, key: str) -> None:
        self.esp_webhook_key_encrypted = crypto.encrypt(key, context=_ESP_WEBHOOK_CONTEXT) if key else ""

    def get_esp_webhook_key(self) -> str:
        """Decrypted in memory only; "" when none is set."""
        return (
            crypto.decrypt(self.esp_webhook_key_encrypted, context=_ESP_WEBHOOK_CONTEXT)
            if self.esp_webhook_key_encrypted
            else ""
        )

    def set_esp_api_key(self, key: str) -> None:
        self.esp_api_key_encrypted = crypto.encrypt(key, context=_ESP_CONTEXT) if key else ""

    def get_esp_api_key(self) -> str:
        """Decrypted in memory only."""
        return (
            crypto.decrypt(self.esp_api_key_encrypted, context=_ESP_CONTEXT)
            if self.esp_api_key_encrypted
            else ""
        )


_ESP_CONTEXT = "integrations.EmailSettings.esp_api_key"
_ESP_WEBHOOK_CONTEXT = "integrations.EmailSettings.esp_webhook_key"
crypto.register_encrypted_field("integrations.EmailSettings", "password_encrypted", _SMTP_CONTEXT)
crypto.register_encrypted_field("integrations.EmailSettings", "esp_api_key_encrypted", _ESP_CONTEXT)
crypto.register_encrypted_field(
    "integrations.EmailSettings", "esp_webhook_key_encrypted", _ESP_WEBHOOK_CONTEXT
)


class TrustedOrigin(models.Model):
    """An origin (scheme://host:port) an operator named on the command line (`demo --graph-url`,
    `--erp-url`, the sandboxes of `up`): called even when it is loopback or private
    (integrations/outbound.py)."""

    origin = models.CharField(_("origin"), max_length=300, unique=True)
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)

    class Meta:
        verbose_name = _("trusted outbound origin")
        verbose_name_plural = _("trusted outbound origins")

    def __str__(self) -> str:
        return self.origin
