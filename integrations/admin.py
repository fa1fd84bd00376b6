from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.db import models
from django.utils.translation import gettext_lazy as _

from integrations.models import EmailSettings, WhatsappNumber, WhatsappPrice


class WhatsappNumberForm(forms.ModelForm):
    graph_url = forms.URLField(
        label=_("Graph API base URL"),
        required=False,
        assume_scheme="https",
        help_text=_("Empty: the deployment's WHATSAPP_GRAPH_URL."),
    )
    access_token = forms.CharField(
        label=_("access token"),
        required=False,
        widget=forms.PasswordInput(render_value=False),
        help_text=_("Stored encrypted. Leave empty to keep the current one."),
    )

    class Meta:
        model = WhatsappNumber
        fields = [
            "organization",
            "store",
            "display_phone_number",
            "phone_number_id",
            "business_account_id",
            "graph_url",
            "messages_per_second",
        ]

    def clean(self):
        cleaned = super().clean()
        if not self.instance.access_token_encrypted and not cleaned.get("access_token"):
            self.add_error("access_token", _("An access token is required."))
        return cleaned

    def save(self, commit: bool = True) -> WhatsappNumber:
        number = super().save(commit=False)
        if self.cleaned_data.get("access_token"):
            number.set_access_token(self.cleaned_data["access_token"])
        if commit:
            number.save()
        return number


@admin.register(WhatsappNumber)
class WhatsappNumberAdmin(admin.ModelAdmin):
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}
    form = WhatsappNumberForm
    list_display = ("display_phone_number", "phone_number_id", "organization", "store", "messages_per_second")
    list_select_related = ("organization", "store")
    list_filter = ("organization",)
    search_fields = ("display_phone_number", "phone_number_id")


@admin.register(WhatsappPrice)
class WhatsappPriceAdmin(admin.ModelAdmin):
    list_display = ("category", "country", "price", "currency", "updated_at")
    list_filter = ("category",)
    search_fields = ("country",)


class EmailSettingsForm(forms.ModelForm):
    password = forms.CharField(
        label=_("password"),
        required=False,
        widget=forms.PasswordInput(render_value=False),
        help_text=_("Stored encrypted. Leave empty to keep the current one."),
    )

    class Meta:
        model = EmailSettings
        fields = [
            "organization",
            "host",
            "port",
            "security",
            "username",
            "sender_name",
            "sender_email",
            "messages_per_minute",
        ]

    def save(self, commit: bool = True) -> EmailSettings:
        settings_ = super().save(commit=False)
        if self.cleaned_data.get("password"):
            settings_.set_password(self.cleaned_data["password"])
        if commit:
            settings_.save()
        return settings_


@admin.register(EmailSettings)
class EmailSettingsAdmin(admin.ModelAdmin):
    form = EmailSettingsForm
    list_display = ("organization", "sender_email", "host", "port", "security", "messages_per_minute")
    list_select_related = ("organization",)
    search_fields = ("sender_email", "host", "organization__name")
    actions = ["send_test_email"]

    @admin.action(description=_("Send a test email to the sender address"))
    def send_test_email(self, request, queryset):
        import smtplib

        from integrations.email.bounces import classify_exception
        from integrations.email.smtp import SmtpServer, send_test_email

        for item in queryset.select_related("organization"):
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
