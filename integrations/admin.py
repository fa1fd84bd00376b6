from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.db import models
from django.http import HttpResponseNotAllowed, HttpResponseRedirect
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.translation import gettext_lazy as _

if TYPE_CHECKING:
    from django.utils.functional import _StrPromise  # a stub-only name: lazy translated strings

import smtplib

from crm.checks import public_url_warnings
from crm.models import Organization
from crm.money import format_money
from crm.tenancy import TenantAdmin, scope
from integrations.email import esp, tracking
from integrations.email.bounces import classify_exception
from integrations.email.smtp import SmtpServer, send_test_email
from integrations.models import (
    ChatwootAccount,
    EmailSettings,
    WhatsappNumber,
    WhatsappPrice,
    WhatsappTemplate,
)
from integrations.services import whatsapp_numbers_resume, whatsapp_templates_sync_enqueue


def write_only_input(label: str | _StrPromise) -> forms.CharField:
    return forms.CharField(
        label=label,
        required=False,
        widget=forms.PasswordInput(render_value=False),
        help_text=_("Stored encrypted. Leave empty to keep the current one."),
    )


def https_urls(field: models.Field, **kwargs: Any) -> forms.Field | None:
    """Model forms' field callback: URLs typed without a scheme are https (Django 6's default)."""
    if isinstance(field, models.URLField):
        kwargs.setdefault("assume_scheme", "https")
    return field.formfield(**kwargs)


class WriteOnlySecretForm(forms.ModelForm):
    """A model form with one write-only secret: never rendered, encrypted by the model's setter,
    left as it is when submitted empty. Subclasses name the form field, the setter and the
    stored (encrypted) column, and declare the field with `write_only_input`."""

    write_only_field = ""
    write_only_setter = ""
    write_only_column = ""
    write_only_required = True

    def clean(self):
        cleaned = super().clean()
        stored = getattr(self.instance, self.write_only_column)
        if self.write_only_required and not stored and not cleaned.get(self.write_only_field):
            self.add_error(self.write_only_field, _("This field is required."))
        return cleaned

    def save(self, commit: bool = True):
        obj = super().save(commit=False)
        if self.cleaned_data.get(self.write_only_field):
            getattr(obj, self.write_only_setter)(self.cleaned_data[self.write_only_field])
        if commit:
            obj.save()
        return obj


class WhatsappNumberForm(WriteOnlySecretForm):
    write_only_field, write_only_setter = "access_token", "set_access_token"
    write_only_column = "access_token_encrypted"
    access_token = write_only_input(_("access token"))
    graph_url = forms.URLField(
        label=_("Graph API base URL"),
        required=False,
        assume_scheme="https",
        help_text=_("Empty: the deployment's WHATSAPP_GRAPH_URL."),
    )

    class Meta:
        formfield_callback = staticmethod(https_urls)  # URLs typed without a scheme: https
        model = WhatsappNumber
        fields = [
            "organization",
            "store",
            "display_phone_number",
            "phone_number_id",
            "business_account_id",
            "graph_url",
            "messages_per_second",
            "paused_at",
            "paused_reason",
        ]
        help_texts = {
            "paused_at": _(
                "Set when Meta refuses this number (its token, registration, display name, quality): "
                "only its messages wait. Fix the cause, then clear both fields and save, or use the "
                "action 'Resume sending': waiting campaigns go on within a minute."
            )
        }


@admin.register(WhatsappNumber)
class WhatsappNumberAdmin(TenantAdmin):
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}
    form = WhatsappNumberForm
    list_display = (
        "display_phone_number",
        "phone_number_id",
        "organization",
        "store",
        "messages_per_second",
        "paused_at",
    )
    list_select_related = ("organization", "store")
    list_filter = ("organization",)
    search_fields = ("display_phone_number", "phone_number_id")
    actions = ["resume_sending", "sync_templates"]

    @admin.action(description=_("Resume sending from the selected numbers"), permissions=["change"])
    def resume_sending(self, request, queryset) -> None:

        resumed = whatsapp_numbers_resume(numbers=queryset)
        self.message_user(request, _("%(n)s number(s) resumed.") % {"n": resumed}, messages.SUCCESS)

    @admin.action(description=_("Sync WhatsApp templates from Meta"), permissions=["change"])
    def sync_templates(self, request, queryset) -> None:
        organizations = sorted(
            set(queryset.exclude(business_account_id="").values_list("organization_id", flat=True))
        )
        for organization_id in organizations:
            whatsapp_templates_sync_enqueue(organization_id=organization_id)
        if organizations:
            self.message_user(
                request,
                _("Templates are being synced; reload the templates page in a moment."),
                messages.SUCCESS,
            )
        else:
            self.message_user(
                request, _("None of these numbers has a WhatsApp Business account id."), messages.WARNING
            )


@admin.register(WhatsappTemplate)
class WhatsappTemplateAdmin(TenantAdmin):
    """The templates Meta has for the organization's business accounts: read-only (they are made at
    Meta and synced daily, or now with the button)."""

    list_display = (
        "name",
        "language",
        "status",
        "category",
        "variable_count",
        "unsupported_reason",
        "synced_at",
    )
    list_filter = ("status", "category", "language")
    search_fields = ("name", "body")
    change_list_template = "admin/integrations/whatsapptemplate/change_list.html"
    readonly_fields = [f.name for f in WhatsappTemplate._meta.fields if f.name != "id"]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list[Any]:
        return [
            path(
                "sync/", self.admin_site.admin_view(self.sync_view), name="integrations_whatsapptemplate_sync"
            ),
            *super().get_urls(),
        ]

    def sync_view(self, request) -> Any:
        """POST: sync the templates of every organization the user manages (a job each)."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        managed = scope(Organization.objects.all(), request.user, "pk", managed=True).values_list(
            "pk", flat=True
        )
        for organization_id in managed:
            whatsapp_templates_sync_enqueue(organization_id=organization_id)
        self.message_user(
            request, _("Templates are being synced; reload this page in a moment."), messages.SUCCESS
        )
        return HttpResponseRedirect(reverse("admin:integrations_whatsapptemplate_changelist"))


@admin.register(WhatsappPrice)
class WhatsappPriceAdmin(TenantAdmin):
    tenant_path = None  # the platform's price table
    list_display = ("category", "country", "price_display", "updated_at")
    list_filter = ("category",)
    search_fields = ("country",)

    @admin.display(description=_("price"), ordering="price")
    def price_display(self, obj: WhatsappPrice) -> str:
        return format_money(obj.price, obj.currency, places=4)


class EmailSettingsForm(WriteOnlySecretForm):
    """The SMTP password and the ESP's API key, both write-only: an SMTP server needs a host, an
    ESP an API key (a stored one is kept when the field is left empty)."""

    write_only_field, write_only_setter, write_only_column = "password", "set_password", "password_encrypted"
    write_only_required = False  # a relay that needs no login
    password = write_only_input(_("password"))
    esp_api_key = write_only_input(_("provider API key"))
    esp_webhook_key = forms.CharField(
        label=_("provider webhook signing key"),
        required=False,
        widget=forms.PasswordInput(render_value=False),
        help_text=_(
            "Mailgun: the HTTP webhook signing key (required for its tracking webhooks). SendGrid: the "
            "Signed Event Webhook verification key (optional; when set, unsigned events are refused). "
            "Stored encrypted. Leave empty to keep the current one."
        ),
    )
    esp_api_url = forms.URLField(
        label=_("provider API URL"),
        required=False,
        assume_scheme="https",
        help_text=_("Empty: the provider's default."),
    )

    class Meta:
        formfield_callback = staticmethod(https_urls)  # URLs typed without a scheme: https
        model = EmailSettings
        fields = [
            "organization",
            "provider",
            "host",
            "port",
            "security",
            "username",
            "esp_api_url",
            "sender_name",
            "sender_email",
            "messages_per_minute",
        ]

    def clean(self):
        cleaned = super().clean()
        provider = cleaned.get("provider")
        if provider == EmailSettings.Provider.SMTP:
            if not cleaned.get("host"):
                self.add_error("host", _("An SMTP server needs a host."))
        elif provider and not self.instance.esp_api_key_encrypted and not cleaned.get("esp_api_key"):
            self.add_error("esp_api_key", _("An email service provider needs an API key."))
        key = cleaned.get("esp_webhook_key", "").strip()
        if key and provider == EmailSettings.Provider.SENDGRID and not tracking.sendgrid_key_valid(key):
            self.add_error("esp_webhook_key", _("This is not the verification key SendGrid shows."))
        return cleaned

    def save(self, commit: bool = True):
        obj = super().save(commit=False)
        if self.cleaned_data.get("esp_api_key"):
            obj.set_esp_api_key(self.cleaned_data["esp_api_key"])
        if self.cleaned_data.get("esp_webhook_key", "").strip():
            obj.set_esp_webhook_key(self.cleaned_data["esp_webhook_key"].strip())
        if commit:
            obj.save()
        return obj


# Where each provider takes the tracking webhook URL, and which events to send to it.
WEBHOOK_STEPS: dict[str, _StrPromise] = {
    EmailSettings.Provider.POSTMARK: _(
        "Postmark: Servers → the server → Webhooks → Add webhook: Delivery, Bounce, Spam complaint, "
        "Open, Link click, Subscription change."
    ),
    EmailSettings.Provider.SENDGRID: _(
        "SendGrid: Settings → Mail Settings → Event Webhook: bounce, dropped, deferred, spam report, "
        "unsubscribe, open, click. Turn on “Signed Event Webhook” and paste its verification key above "
        "to have every event's signature checked."
    ),
    EmailSettings.Provider.MAILGUN: _(
        "Mailgun: Sending → Webhooks: this URL for permanent failure, temporary failure, spam "
        "complaints, unsubscribes, opens and clicks; paste the “HTTP webhook signing key” shown there "
        "above, or every Mailgun event is refused."
    ),
    EmailSettings.Provider.BREVO: _(
        "Brevo: Transactional → Settings → Webhook: this URL for hard bounce, soft bounce, blocked, "
        "spam, unsubscribed, opened, clicked."
    ),
}


@admin.register(EmailSettings)
class EmailSettingsAdmin(TenantAdmin):
    form = EmailSettingsForm
    fieldsets = (
        (
            None,
            {"fields": ("organization", "sender_name", "sender_email", "messages_per_minute", "provider")},
        ),
        (_("SMTP server"), {"fields": ("host", "port", "security", "username", "password")}),
        (
            _("Email service provider (django-anymail)"),
            {"fields": ("esp_api_key", "esp_api_url", "esp_webhook_key", "tracking_webhook")},
        ),
    )
    readonly_fields = ("tracking_webhook",)
    list_display = (
        "organization",
        "sender_email",
        "provider",
        "host",
        "port",
        "security",
        "messages_per_minute",
    )
    list_select_related = ("organization",)
    search_fields = ("sender_email", "host", "organization__name")
    actions = ["send_test_email"]

    def changelist_view(self, request, extra_context=None):
        self._warn_about_public_url(request)
        return super().changelist_view(request, extra_context)

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        self._warn_about_public_url(request)
        return super().changeform_view(request, object_id, form_url, extra_context)

    @admin.display(description=_("tracking webhook URL"))
    def tracking_webhook(self, obj: EmailSettings) -> str | _StrPromise:
        """The URL to paste into the provider's webhook settings (with this organization's basic auth)."""
        if obj.pk is None or obj.provider not in tracking.VIEWS:
            return _("Save the settings with an email service provider to see its webhook URL.")
        credentials = tracking.organization_credentials(settings.ANYMAIL_WEBHOOK_SECRET, obj.organization_id)
        if not credentials:
            return _(
                "Set ANYMAIL_WEBHOOK_SECRET (user:password) in the deployment: without it every ESP "
                "webhook is refused."
            )
        path = reverse(
            "esp-tracking-organization",
            kwargs={"provider": obj.provider, "organization_id": obj.organization_id},
        )
        scheme, _sep, host = settings.PUBLIC_URL.rstrip("/").partition("://")
        key: str | _StrPromise = ""
        if obj.provider in tracking.SIGNED:
            key = (
                _("a signing key is stored") if obj.esp_webhook_key_encrypted else _("no signing key stored")
            )
        return format_html(
            "<code>{}://{}@{}{}</code><br>{} {}",
            scheme,
            credentials,
            host,
            path,
            WEBHOOK_STEPS[obj.provider],
            key,
        )

    @staticmethod
    def _warn_about_public_url(request) -> None:
        """The system check's crm.W001 where email is configured (on GET only: a POST redirects,
        and the page it lands on says it again)."""
        if request.method != "GET":
            return
        for warning in public_url_warnings(public_url=settings.PUBLIC_URL, debug=settings.DEBUG):
            messages.warning(request, f"{warning.msg} {warning.hint}")

    @admin.action(description=_("Send a test email to the sender address"), permissions=["change"])
    def send_test_email(self, request, queryset):

        for item in queryset.select_related("organization"):
            if item.provider != EmailSettings.Provider.SMTP:
                label = f"{item.sender_email} via {item.get_provider_display()}"
                result = esp.send_test_email(
                    provider=item.provider,
                    api_key=item.get_esp_api_key(),
                    api_url=item.esp_api_url,
                    sender=item.sender_email,
                    to=item.sender_email,
                )
                if result.failure is not None:
                    failure = result.failure
                    text = f"{failure.kind} — {failure.code or ''} {failure.message}".strip()
                    messages.error(request, f"{label}: {text}")
                elif result.transient or result.unknown:
                    messages.error(request, f"{label}: {result.transient or result.unknown}")
                else:
                    messages.success(request, f"{label}: {result.reply}")
                continue
            server = SmtpServer(item.host, item.port, item.security, item.username, item.get_password())
            try:
                answer = send_test_email(server, sender=item.sender_email, to=item.sender_email)
            except (smtplib.SMTPException, OSError) as exc:
                failure = classify_exception(exc)
                messages.error(
                    request, f"{item}: {failure.kind} — {failure.code or ''} {failure.message}".strip()
                )
            else:
                messages.success(request, f"{item}: {answer}")


class ChatwootAccountForm(WriteOnlySecretForm):
    write_only_field, write_only_setter, write_only_column = (
        "api_token",
        "set_api_token",
        "api_token_encrypted",
    )
    api_token = write_only_input(_("API access token"))
    base_url = forms.URLField(label=_("Chatwoot URL"), assume_scheme="https")

    class Meta:
        formfield_callback = staticmethod(https_urls)  # URLs typed without a scheme: https
        model = ChatwootAccount
        fields = ["organization", "base_url", "account_id", "inbox_id", "mode", "enabled"]


@admin.register(ChatwootAccount)
class ChatwootAccountAdmin(TenantAdmin):
    form = ChatwootAccountForm
    list_display = ("organization", "base_url", "account_id", "inbox_id", "mode", "enabled")
    list_select_related = ("organization",)
    list_filter = ("enabled", "mode")
