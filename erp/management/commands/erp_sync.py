from __future__ import annotations

import re
import sys
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from django.core.management.base import CommandError, CommandParser
from django.utils.translation import gettext as _
from tqdm import tqdm

from crm import cli
from crm.models import Store
from erp import services
from erp.models import ErpConnection
from integrations.errors import IntegrationError

_WHEN = re.compile(r"^(\d{4}-\d{2}-\d{2})(?:[T ](\d{2}))?$")


def _bound(value: str, zone: ZoneInfo, *, end: bool) -> datetime:
    """`YYYY-MM-DD` or `YYYY-MM-DDTHH` in the organization's zone; an end covers its whole day/hour."""
    match = _WHEN.match(value.strip())
    if not match:
        raise CommandError(_("%(value)r: expected YYYY-MM-DD or YYYY-MM-DDTHH") % {"value": value})
    day, hour = match.groups()
    try:
        when = datetime.fromisoformat(f"{day}T{hour or '00'}:00").replace(tzinfo=zone)
    except ValueError as exc:
        raise CommandError(
            _("%(value)r is not a date (%(error)s)") % {"value": value, "error": exc}
        ) from None
    if end:
        when += timedelta(hours=1) if hour else timedelta(days=1)
    return when


class Command(cli.CrmCommand):
    help = (
        "Run an ERP sync now, in this process, with a progress bar and a summary line: "
        "`erp_sync sales --store CODE --from YYYY-MM-DD[THH] [--to …]` or `erp_sync customers [--full]`."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="what", required=True, help="what to sync: sales or customers")
        sales = sub.add_parser("sales", help="one store's sales for a window")
        sales.add_argument("--store", required=True, help="the store's ERP code (filial)")
        sales.add_argument("--org", help="organization slug (needed when several have an ERP connection)")
        sales.add_argument(
            "--from",
            dest="start",
            required=True,
            help="YYYY-MM-DD or YYYY-MM-DDTHH, organization's time zone",
        )
        sales.add_argument(
            "--to",
            dest="end",
            help="YYYY-MM-DD or YYYY-MM-DDTHH, inclusive: through the end of that day or hour "
            "(default: --from)",
        )
        customers = sub.add_parser(
            "customers", help="customers after the high-water mark, or all with --full"
        )
        customers.add_argument("--org", help="organization slug (needed when several have an ERP connection)")
        customers.add_argument(
            "--full",
            action="store_true",
            help="from trans_id 0 (or resume today's interrupted full sync where it stopped)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        connection = self._connection(options["org"])
        try:
            if options["what"] == "customers":
                self._customers(connection, full=options["full"])
            else:
                self._sales(connection, options)
        except IntegrationError as exc:
            details = f" ({exc.details})" if exc.details else ""
            hint = _(" — retry later") if exc.retryable else ""
            raise CommandError(
                _("the ERP sync stopped: %(error)s") % {"error": f"{exc}{details}"} + hint
            ) from None

    @staticmethod
    def _connection(slug: str | None) -> ErpConnection:
        rows = ErpConnection.objects.select_related("organization")
        if slug:
            connection = rows.filter(organization__slug=slug).first()
            if connection is None:
                cli.organization_or_error(slug)
                raise CommandError(
                    _("organization %(slug)r has no ERP connection (add one in the admin)") % {"slug": slug}
                )
            return connection
        found = list(rows.filter(enabled=True)[:2])
        if len(found) != 1:
            raise CommandError(
                _("no organization has an enabled ERP connection (add one in the admin)")
                if not found
                else _("several organizations have an ERP connection: pass --org SLUG")
            )
        return found[0]

    def _customers(self, connection: ErpConnection, *, full: bool) -> None:
        with tqdm(unit=_(" customers"), disable=None, file=sys.stderr, dynamic_ncols=True) as bar:

            def progress(result: services.SyncResult) -> None:
                bar.update(result.read - bar.n)
                bar.set_postfix(trans_id=result.trans_id, skipped=result.skipped, refresh=False)

            result = services.customers_sync(connection=connection, full=full, progress=progress)
        self.stdout.write(result.summary())

    def _sales(self, connection: ErpConnection, options: dict[str, Any]) -> None:
        zone = services.organization_zone(connection.organization)
        store = Store.objects.filter(
            organization_id=connection.organization_id, erp_code=options["store"]
        ).first()
        if store is None:
            codes = cli.listing(
                Store.objects.filter(organization_id=connection.organization_id)
                .order_by("erp_code")
                .values_list("erp_code", flat=True)[:21]
            )
            raise CommandError(
                _("no store %(code)r in %(organization)s (stores: %(codes)s)")
                % {"code": options["store"], "organization": connection.organization, "codes": codes}
            )
        start = _bound(options["start"], zone, end=False)
        end = _bound(options["end"] or options["start"], zone, end=True)
        if end <= start:
            raise CommandError(_("--to is before --from"))
        with tqdm(unit=_(" sales"), disable=None, file=sys.stderr, dynamic_ncols=True) as bar:

            def progress(result: services.SyncResult) -> None:
                bar.update(result.read - bar.n)

            result = services.sales_sync(
                store=store, start=start, end=end, connection=connection, progress=progress
            )
        self.stdout.write(
            _("%(start)s to %(end)s %(zone)s: %(summary)s")
            % {
                "start": f"{start:%Y-%m-%d %H:%M}",
                "end": f"{end:%Y-%m-%d %H:%M}",
                "zone": zone.key,
                "summary": result.summary(),
            }
        )
