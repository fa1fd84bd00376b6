"""What the campaign's change page shows: live status, audience, attribution, replies, charts, previews."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.urls import reverse
from django.utils import timezone as dj_timezone
from django.utils.formats import date_format, number_format
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe
from django.utils.text import capfirst
from django.utils.translation import gettext_lazy as _

from campaigns import audience, composer, lift_pages, selectors
from campaigns.email.content import compiled_email, variables_for
from campaigns.models import (
    Campaign,
    Channel,
    EmailMessage,
    WhatsappMessage,
)
from campaigns.recurrence import describe, next_occurrences, recurrence_error
from crm.cli import number
from crm.money import format_cost, format_money
from crm.tenancy import TenantAdmin
from messaging import email_render

# Labels of every key in campaign_status()["counts"], both channels.
COUNT_LABELS = {
    **dict(WhatsappMessage.Status.choices),
    **dict(EmailMessage.Status.choices),
    "opened": _("opened"),
    "clicked": _("clicked"),
}


def now_labels(channel: str) -> dict[str, Any]:
    """Labels of the campaign page's "Now" counts: each message in exactly one current state, so a
    WhatsApp "sent" there is sent and not yet delivered (the organization page counts cumulatively)."""
    labels = dict(COUNT_LABELS)
    if channel == Channel.WHATSAPP:
        labels.update(sent=_("sent (not yet delivered)"), delivered=_("delivered (not read)"), read=_("read"))
    return labels


def _per_cost(figures: selectors.CampaignAttribution) -> str:
    """Revenue ÷ cost when both are in reais, else through the organization's conversion rate,
    labelled an estimate; "—" when neither (two currencies are never divided as if one)."""
    if figures.revenue_per_cost is not None:
        return number(figures.revenue_per_cost, 2)
    if figures.revenue_per_cost_estimate is not None:
        return str(_("%(ratio)s (estimate)") % {"ratio": number(figures.revenue_per_cost_estimate, 2)})
    return "—"


def preview_cost(preview: audience.AudiencePreview, campaign: Campaign) -> str:
    """The preview's estimated cost in its currency (and in reais at the organization's rate)."""
    if preview.cost is None:
        return str(_("no per-message price"))
    org = campaign.organization
    return format_cost(
        preview.cost,
        preview.currency,
        rate=org.cost_conversion_rate,
        rate_currency=org.cost_conversion_currency,
    )


def audience_html(preview: audience.AudiencePreview, campaign: Campaign) -> str:
    """The audience preview as the campaign page shows it."""
    rows = format_html_join(
        "",
        '<tr><th>{}</th><td data-skip="{}">{}</td></tr>',
        ((audience.SKIP_LABELS[key], key, number(n)) for key, n in preview.skipped.items()),
    )
    problem = format_html(
        '<p class="errornote" id="audience-problem">{} {}</p>', _("It cannot start:"), preview.problem
    )
    return format_html(
        '<div id="audience-preview"><p><strong data-field="receives">{}</strong> {} · {} '
        '<strong data-field="estimated-cost">{}</strong></p>{}'
        '<table id="audience-skips"><caption>{}</caption>{}</table></div>',
        number(preview.receives),
        _("will receive it"),
        _("estimated cost:"),
        preview_cost(preview, campaign),
        problem if preview.problem else "",
        _("Skipped, by reason"),
        rows,
    )


class CampaignDisplay(TenantAdmin):
    """The campaign change page's read-only panels (CampaignAdmin's readonly_fields)."""

    @admin.display(description=_("progress"))
    def progress(self, obj: Campaign) -> str:
        """Processed (every message settled, sent or not) and sent apart: a campaign that skipped
        everyone reads "4/4 processed · 0 sent", never "100%" alone."""
        metric = getattr(obj, "metric", None)
        if metric is None or not metric.queued:
            return "—"
        done = metric.sent + metric.bounced + metric.blocked + metric.failed + metric.unknown + metric.skipped
        return _("%(done)s/%(total)s processed (%(percent)s%%) · %(sent)s sent") % {
            "done": number_format(done, force_grouping=True),
            "total": number_format(metric.queued, force_grouping=True),
            "percent": 100 * done // metric.queued,
            "sent": number_format(metric.sent, force_grouping=True),
        }

    @admin.display(description=_("live status"))
    def live_status(self, obj: Campaign) -> str:
        if not obj.pk:
            return "—"
        data = selectors.campaign_status(campaign=obj)
        labels = now_labels(obj.channel)
        engagement = [k for k in selectors.ENGAGEMENT_KEYS if k in data["counts"]]
        now_rows = format_html_join(
            "",
            '<tr><th>{}</th><td data-count="{}">{}</td></tr>',
            ((labels.get(k, k), k, number(v)) for k, v in data["counts"].items() if k not in engagement),
        )
        engagement_rows = format_html_join(
            "",
            '<tr><th>{}</th><td data-count="{}">{}</td></tr>',
            ((COUNT_LABELS[k], k, number(data["counts"][k])) for k in engagement),
        )
        return format_html(
            '<div id="live-status" data-url="{}">'
            '<p class="errornote" data-field="sending_paused"{}>{} <span>{}</span></p>'
            '<progress max="1" value="{}"></progress> '
            '{} <span data-field="progress">{}%</span> (<span data-field="processed">{}</span>/'
            '<span data-field="total">{}</span>) · {} <span data-field="reached">{}</span> · '
            '<span data-field="status">{}</span>'
            '<table id="live-now"><caption>{}</caption>{}</table>'
            '<table id="live-reached"><caption>{}</caption>{}'
            '<tr><th>{}</th><td data-field="cost">{}</td></tr>'
            '<tr><th>{}</th><td><span data-field="rate">{}</span>/s</td></tr>'
            '<tr><th>{}</th><td data-field="eta_seconds">{}</td></tr></table></div>',
            "../status/",
            "" if data["sending_paused"] else mark_safe(" hidden"),
            _(
                "Sending is paused (fix the cause, then resume it on the organization's page or, for a "
                "WhatsApp number, with the WhatsApp numbers' action 'Resume sending'):"
            ),
            data["sending_paused"],
            data["progress"],
            _("Processed:"),
            number(round(100 * data["progress"], 1), 1),
            number(data["processed"]),
            number(data["total"]),
            _("sent:"),
            number(data["reached"]),
            data["status_label"],
            _("Now: each message once, in its current state"),
            now_rows,
            _("So far (cumulative)"),
            engagement_rows,
            _("cost"),
            data["cost_display"],
            _("rate"),
            number(data["rate"], 2),
            _("ETA"),
            f"{number(data['eta_seconds'])} s"
            if data["eta_seconds"]
            else "—",  # as the page's script writes it
        )

    @admin.display(description=_("audience now"))
    def audience_counts(self, obj: Campaign) -> str:
        """Before the start: who will receive it, who is skipped by reason (no consent first:
        marketing needs a recorded consent) and the estimated cost, by the fan-out's own rules; and
        why it cannot start when nobody would. Once started, the messages' counts tell it."""
        if not obj.pk or obj.content_locked:
            return "—"
        preview = audience.audience_preview(campaign=obj)
        split = preview.receives + preview.skipped.get("control_group", 0)
        return format_html("{}{}", audience_html(preview, obj), lift_pages.detectable(obj, split))

    @admin.display(description=_("incremental (against the control group)"))
    def incrementality(self, obj: Campaign) -> str:
        """Attributed (last touch) and incremental side by side (campaigns.lift)."""
        if not obj.pk:
            return "—"
        return lift_pages.side_by_side(obj, selectors.campaign_attribution(campaign_id=obj.pk))

    @admin.display(description=_("what it sold"))
    def attribution(self, obj: Campaign) -> str:
        """Attributed revenue and sales against the customers reached and the cost (campaigns.attribution)."""
        if not obj.pk:
            return "—"
        figures = selectors.campaign_attribution(campaign_id=obj.pk)
        rate = figures.conversion_rate
        rows = (
            ("revenue", _("revenue"), format_money(figures.revenue)),
            ("conversions", _("conversions (attributed sales)"), number(figures.conversions)),
            ("buyers", _("customers who bought"), number(figures.buyers)),
            (
                "conversion_rate",
                _("conversion rate (customers who bought ÷ reached)"),
                "—" if rate is None else f"{number(100 * rate, 1)}%",
            ),
            ("revenue_per_cost", _("revenue ÷ cost"), _per_cost(figures)),
        )
        return format_html(
            '<table id="campaign-attribution">{}</table><p class="help">{}</p>',
            format_html_join(
                "", '<tr><th>{}</th><td data-field="{}">{}</td></tr>', ((t, k, v) for k, t, v in rows)
            ),
            _(
                "Sales of customers this campaign reached, made within the organization's attribution "
                "window after its message and credited to the last campaign message before them."
            ),
        )

    @admin.display(description=_("replies"))
    def replies(self, obj: Campaign) -> str:
        """Who wrote back (reply rate over the customers reached) and the latest replies."""
        if not obj.pk or obj.started_at is None:
            return "—"
        replied = selectors.campaign_replies(campaign_id=obj.pk)
        reached = getattr(getattr(obj, "metric", None), "sent", 0)
        rate = f"{number(100 * replied / reached, 1)}%" if reached else "—"
        latest = format_html_join(
            "",
            '<tr><td>{}</td><td><a href="{}">{}</a></td><td>{}</td></tr>',
            (
                (
                    date_format(dj_timezone.localtime(m.at), "SHORT_DATETIME_FORMAT"),
                    reverse("admin:crm_customer_change", args=[m.customer_id]),
                    m.customer,
                    m.text or f"[{m.kind}]",
                )
                for m in selectors.campaign_latest_replies(campaign_id=obj.pk)
            ),
        )
        return format_html(
            '<p id="campaign-replies"><span data-field="replies">{}</span> {} · {} '
            '<span data-field="reply_rate">{}</span></p><table>{}</table>',
            number(replied),
            _("customers wrote back"),
            _("reply rate (÷ reached):"),
            rate,
            latest,
        )

    @admin.display(description=_("charts"))
    def charts(self, obj: Campaign) -> str:
        if not obj.pk or obj.started_at is None:
            return "—"
        return format_html(
            '<div id="campaign-charts" data-url="{}" data-time-label="{}">'
            '<h4>{}</h4><div id="campaign-chart-events"></div>'
            '<h4>{}</h4><div id="campaign-chart-cost" data-title="{}"></div></div>',
            "../series/",
            _("time"),
            _("Messages over time"),
            _("Cost over time (cumulative)"),
            _("cost"),
        )

    @admin.display(description=_("next occurrences"))
    def recurrence_next(self, obj: Campaign) -> str:
        """The recurrence's next runs in the organization's time zone, or why it cannot be read."""
        if not obj.recurrence:
            return "—"
        problem = recurrence_error(obj.recurrence)
        if problem:
            return problem
        zone = obj.organization.timezone
        runs = next_occurrences(obj.recurrence, zone)
        words = describe(obj.recurrence)
        return format_html(
            '<span id="recurrence-words">{}</span> <span id="recurrence-next">{} ({})</span>',
            f"{capfirst(words)}:" if words else "",
            ", ".join(date_format(r, "DATETIME_FORMAT") for r in runs),
            zone,
        )

    @admin.display(description=_("preview (first recipients)"))
    def preview(self, obj: Campaign) -> str:
        if not obj.pk:
            return "—"
        if obj.channel == Channel.EMAIL:
            return self._email_preview(obj)
        return composer.preview_html(obj, selectors.campaign_audience(campaign=obj).order_by("pk")[:5])

    def _email_preview(self, obj: Campaign) -> str:
        """The email as the first recipient will see it (links not yet tracked), or the compile error."""
        customer = selectors.campaign_audience(campaign=obj).order_by("pk").first()
        if customer is None:
            return str(_("No recipient in the audience."))
        try:
            compiled = compiled_email(obj)
        except email_render.TemplateError as exc:
            return format_html('<p class="errornote">{}</p>', exc)
        store = obj.audience_store.name if obj.audience_store else obj.organization.name
        rendered = email_render.render_email(
            compiled,
            variables=variables_for(customer, store_name=store, unsubscribe_url="#"),
            click_url="",
            open_pixel_url=None,
        )
        return format_html(
            "<p><strong>{}</strong> {} &lt;{}&gt;</p><p><strong>{}</strong> {}</p>"
            '<iframe sandbox srcdoc="{}" style="width:100%;max-width:700px;height:520px;'
            'border:1px solid #ccc;background:#fff"></iframe>',
            _("To:"),
            customer.name,
            customer.email,
            _("Subject:"),
            rendered.subject,
            rendered.html,
        )
