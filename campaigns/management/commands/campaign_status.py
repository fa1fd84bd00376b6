from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

from django.core.management.base import CommandParser
from django.utils.translation import gettext as _
from django.utils.translation import pgettext_lazy

from campaigns import lift_pages, selectors
from campaigns.management.commands._campaign import campaign_or_error
from campaigns.models import Campaign
from crm import cli

# A campaign in one of these will not change any more: --watch stops there.
FINISHED = (Campaign.Status.SENT, Campaign.Status.CANCELLED, Campaign.Status.STOPPED)

COUNT_LABELS = {
    "queued": pgettext_lazy("message count", "queued"),
    "sending": pgettext_lazy("message count", "sending"),
    "sent": pgettext_lazy("message count", "sent"),
    "delivered": pgettext_lazy("message count", "delivered"),
    "read": pgettext_lazy("message count", "read"),
    "bounced": pgettext_lazy("message count", "bounced"),
    "failed": pgettext_lazy("message count", "failed"),
    "unknown": pgettext_lazy("message count", "outcome unknown"),
    "skipped": pgettext_lazy("message count", "skipped"),
    "cancelled": pgettext_lazy("message count", "cancelled"),
    "held_out": pgettext_lazy("message count", "held out"),
    "opened": pgettext_lazy("message count", "opened"),
    "clicked": pgettext_lazy("message count", "clicked"),
}


class Command(cli.CrmCommand):
    help = "A campaign's status, counts by message status, cost and send rate."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("campaign_id", type=int, help="the campaign's id")
        parser.add_argument(
            "--json", action="store_true", help="print the JSON object (the keys scripts read)"
        )
        self.add_watch_argument(parser, "it, and stop when the campaign is finished,")

    def handle(self, *args: Any, **options: Any) -> None:
        campaign = campaign_or_error(options["campaign_id"])
        if options["watch"] is None:
            self.stdout.write("\n".join(self._frame(campaign, as_json=options["json"])[0]))
            return
        self.watch(
            lambda: self._frame(campaign, as_json=options["json"]),
            every=options["watch"],
            as_json=options["json"],
        )

    @staticmethod
    def _frame(campaign: Campaign, *, as_json: bool) -> tuple[list[str], bool]:
        campaign.refresh_from_db()
        data = selectors.campaign_status(campaign=campaign)
        done = campaign.status in FINISHED
        if as_json:
            return [json.dumps(data)], done
        eta = (
            _("  ETA %(seconds)ss") % {"seconds": cli.number(data["eta_seconds"])}
            if data["eta_seconds"]
            else ""
        )
        lines = [
            _("campaign %(id)s '%(name)s': %(status)s  %(progress)s%%  rate %(rate)s/s  cost %(cost)s")
            % {
                "id": data["id"],
                "name": data["name"],
                "status": data["status_label"],
                "progress": cli.number(100 * data["progress"], 1),
                "rate": cli.number(data["rate"]),
                "cost": f"{cli.number(Decimal(data['cost']))} {data['cost_currency']}",
            }
            + eta,
            "  ".join(f"{COUNT_LABELS.get(k, k)} {cli.number(v)}" for k, v in data["counts"].items()),
        ]
        if data["lift"] is not None:
            lines.append(lift_pages.summary_line(data["lift"]))
        if data["stop_reason"]:
            lines.append(_("stopped: %(reason)s") % {"reason": data["stop_reason"]})
        if data["sending_paused"]:
            lines.append(_("sending paused: %(reason)s") % {"reason": data["sending_paused"]})
        return lines, done
