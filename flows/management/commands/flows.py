"""manage.py flows import FILE --org SLUG | export KEY --org SLUG | status KEY --org SLUG [--json]
| pause KEY --org SLUG | resume KEY --org SLUG."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.core.management.base import CommandError, CommandParser

from campaigns import lift_pages
from crm import cli
from flows import selectors, services
from flows.schema import FlowSchemaError


class Command(cli.CrmCommand):
    help = "Import, export, inspect, pause and resume an organization's flows (docs/flows.md)."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True, help="what to do")
        imp = sub.add_parser("import", help="create or update a flow from a JSON file (by its key)")
        imp.add_argument("file", help="a JSON file with one flow (docs/flows.md)")
        imp.add_argument("--org", required=True, help="the organization's slug")
        for name, what in (
            ("export", "print a flow's JSON"),
            ("pause", "pause a flow"),
            ("resume", "resume a flow"),
        ):
            p = sub.add_parser(name, help=what)
            p.add_argument("key", help="the flow's key")
            p.add_argument("--org", required=True, help="the organization's slug")
        status = sub.add_parser("status", help="a flow's figures")
        status.add_argument("key", help="the flow's key")
        status.add_argument("--org", required=True, help="the organization's slug")
        status.add_argument("--json", action="store_true", help="one JSON object (docs/flows.md)")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            self._handle(options)
        except (FlowSchemaError, services.FlowError) as exc:
            raise CommandError(str(exc)) from None

    def _handle(self, options: dict[str, Any]) -> None:
        action, org = options["action"], options["org"]
        if action == "import":
            try:
                data = json.loads(Path(options["file"]).read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise CommandError(f"{options['file']}: {exc}") from None
            flow, created = services.flow_import(data=data, organization_slug=org)
            self.stdout.write(
                f"{'created' if created else 'updated'} flow {flow.key} (version {flow.version})"
            )
            return
        flow = services.flow_get(key=options["key"], organization_slug=org)
        if action == "export":
            self.stdout.write(json.dumps(services.flow_export(flow=flow), ensure_ascii=False, indent=2))
        elif action in ("pause", "resume"):
            services.flow_set_paused(flow=flow, paused=action == "pause")
            self.stdout.write(f"flow {flow.key} {'paused' if action == 'pause' else 'resumed'}")
        else:
            status = selectors.flow_status(flow=flow)
            if options["json"]:
                status["steps"] = [{k: s[k] for k in ("index", "type", "done")} for s in status["steps"]]
                status["lift"] = selectors.flow_lift(flow=flow)
                self.stdout.write(json.dumps(status))
                return
            self.stdout.write(
                f"{flow.key}{' (paused)' if flow.paused else ''}: entered {status['entered']}, "
                f"active {status['active']}, completed {status['completed']}, exited {status['exited']}, "
                f"sent {status['sent']}, failed {status['failed']}, revenue {status['revenue']}"
            )
            for s in status["steps"]:
                self.stdout.write(
                    f"  {s['index']:>2} {s['type']:<14} done {s['done']}, sent {s['sent']}, "
                    f"revenue {s['revenue']}"
                )
            lift = selectors.flow_lift(flow=flow)
            if lift is not None:  # the campaigns' line (campaign_status), for the holdout branch
                self.stdout.write(lift_pages.summary_line(lift))
