"""The campaign page's incrementality: attributed (last touch) and incremental figures side by
side, said plainly when not significant, and before the start the minimum detectable lift of the
chosen split (campaigns.lift)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext as _

from campaigns import lift
from campaigns.models import Campaign
from campaigns.selectors import CampaignAttribution
from crm.cli import number
from crm.money import format_money


def _percent(value: float | None) -> str:
    return "—" if value is None else f"{'+' if value > 0 else ''}{number(100 * value, 1)}%"


def _upper(high: float | None) -> str:
    """An interval's upper end; null in a report means without limit (no buyer held out yet)."""
    return "+∞" if high is None else _percent(high)


def detectable(campaign: Campaign, audience: int) -> str:
    """Before the start, a sentence: the smallest lift of the buyers rate the chosen control group
    can detect among `audience` recipients (or a hint to set one)."""
    if not campaign.control_percent:
        return str(_(" · no control group: only attributed (last touch) sales will be shown"))
    base = lift.base_buyers_rate(organization=campaign.organization, channel=campaign.channel)
    mde = lift.campaign_mde(campaign=campaign, audience=audience, base_rate=base)
    if mde is None:
        return str(
            _(" · control group %(p)s%%: too few customers or sales yet to tell the detectable lift")
            % {"p": campaign.control_percent}
        )
    return str(
        _(
            " · control group %(p)s%%: the smallest lift of the buyers rate it can detect is %(mde)s "
            "(base rate %(base)s, 95%% confidence, 80%% power)"
        )
        % {"p": campaign.control_percent, "mde": _percent(mde), "base": _percent(base).lstrip("+")}
    )


def _verdict(report: dict[str, Any], *, flow: bool = False) -> str:
    if report["buyers_rate_lift"] is None:
        if report["treatment"]["customers"] and report["control"]["customers"]:
            return str(_("No sale yet in either group: nothing to compare."))
        return str(_("No one has been sent or held out yet."))
    low, high = report["buyers_rate_lift_ci95"]
    high_shown = _upper(high)
    if report["significant"]:
        return str(
            _(
                "Significant: the buyers rate is %(lift)s against the control group (95%% interval "
                "%(low)s to %(high)s, p = %(p)s)."
            )
            % {
                "lift": _percent(report["buyers_rate_lift"]),
                "low": _percent(low),
                "high": high_shown,
                "p": report["p_value"],
            }
        )
    not_significant = (
        _(
            "Not significant: the difference from the control group (%(lift)s, 95%% interval %(low)s to "
            "%(high)s, p = %(p)s) is within what chance alone produces; this flow may have caused "
            "no sales at all."
        )
        if flow
        else _(
            "Not significant: the difference from the control group (%(lift)s, 95%% interval %(low)s to "
            "%(high)s, p = %(p)s) is within what chance alone produces; this campaign may have caused "
            "no sales at all."
        )
    )
    return str(
        not_significant
        % {
            "lift": _percent(report["buyers_rate_lift"]),
            "low": _percent(low),
            "high": high_shown,
            "p": report["p_value"],
        }
    )


def _incremental_buyers(report: dict[str, Any]) -> int:
    """Treated buyers beyond those the control group's rate predicts."""
    treatment, control = report["treatment"], report["control"]
    if not control["customers"]:
        return 0
    return round(treatment["buyers"] - treatment["customers"] * control["buyers"] / control["customers"])


def side_by_side(campaign: Campaign, attributed: CampaignAttribution) -> str:
    """The campaign page's table of attributed (last touch) against incremental figures."""
    report = lift.campaign_lift(campaign=campaign)
    if report is None:
        return str(
            _(
                "No control group: what this campaign caused cannot be told apart from what would "
                "have sold anyway."
            )
        )
    return report_side_by_side(report, revenue=attributed.revenue, buyers=attributed.buyers)


def report_side_by_side(report: dict[str, Any], *, revenue: Decimal, buyers: int, flow: bool = False) -> str:
    """A lift report (campaigns.lift: a campaign's, a flow's) beside the attributed (last touch)
    revenue and buyers, with the verdict in words."""
    treated = report["treatment"]["customers"]
    control = report["control"]
    interval = report["revenue_per_customer_lift_ci95"]
    incremental_range = (
        f"{format_money(Decimal(interval[0]) * treated)} … {format_money(Decimal(interval[1]) * treated)}"
        if interval
        else "—"
    )
    rows = (
        (
            _("revenue"),
            format_money(revenue),
            format_money(Decimal(report["incremental_revenue"])),
        ),
        (_("revenue, 95% interval"), "—", incremental_range),
        (_("customers who bought"), number(buyers), number(_incremental_buyers(report))),
        (_("buyers rate lift"), "—", _percent(report["buyers_rate_lift"])),
        (
            _("control group"),
            "—",
            _("%(customers)s customers, %(buyers)s bought, %(revenue)s")
            % {
                "customers": number(control["customers"]),
                "buyers": number(control["buyers"]),
                "revenue": format_money(Decimal(control["revenue"])),
            },
        ),
    )
    return format_html(
        '<table id="{}"><tr><th></th><th>{}</th><th>{}</th></tr>{}</table>'
        '<p class="help" data-significant="{}">{}</p>',
        "flow-lift" if flow else "campaign-lift",
        _("attributed (last touch)"),
        _("incremental"),
        format_html_join("", "<tr><th>{}</th><td>{}</td><td>{}</td></tr>", rows),
        "yes" if report["significant"] else "no",
        _verdict(report, flow=flow),
    )


def summary_line(report: dict[str, Any]) -> str:
    """A lift report in one line (`campaign_status`, `flows status`); with nothing to compare yet,
    dashes and why (not "None")."""
    low, high = report["buyers_rate_lift_ci95"] or [None, None]
    empty = report["buyers_rate_lift"] is None
    shown = {
        "lift": _percent(report["buyers_rate_lift"]),
        "low": _percent(low),
        "high": "—" if empty else _upper(high),
        "p": "—" if report["p_value"] is None else report["p_value"],
    }
    line = str(
        _(
            "lift: buyers rate %(lift)s (95%% interval %(low)s to %(high)s, p %(p)s), "
            "incremental revenue %(revenue)s"
        )
        % {**shown, "revenue": report["incremental_revenue"]}
    )
    return f"{line} — {_verdict(report)}" if empty else line
