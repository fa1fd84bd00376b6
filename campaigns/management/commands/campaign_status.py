from __future__ import annotations

import json

from django.core.management.base import BaseCommand

from campaigns import selectors
from campaigns.management.commands._campaign import campaign_or_error


class Command(BaseCommand):
    help = "A campaign's status, counts by message status, cost and send rate."

    def add_arguments(self, parser) -> None:
        parser.add_argument("campaign_id", type=int)
        parser.add_argument("--json", action="store_true")

    def handle(self, *args, **options) -> None:
        campaign = campaign_or_error(options["campaign_id"])
        data = selectors.campaign_status(campaign=campaign)
        if options["json"]:
            self.stdout.write(json.dumps(data))
            return
        counts = "  ".join(f"{k} {v}" for k, v in data["counts"].items())
        eta = f"  ETA {data['eta_seconds']}s" if data["eta_seconds"] else ""
        self.stdout.write(
            f"campaign {data['id']} '{data['name']}': {data['status']}  "
            f"{100 * data['progress']:.1f}%  rate {data['rate']}/s  cost {data['cost']}{eta}"
        )
        self.stdout.write(counts)
        if data["stop_reason"]:
            self.stdout.write(f"stopped: {data['stop_reason']}")
