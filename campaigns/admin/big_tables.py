"""Admin lists over tables of millions of rows: capped counts, index-friendly filters."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ChangeList
from django.core.paginator import Page, Paginator
from django.db import connections, models
from django.db.models import QuerySet
from django.http import (
    HttpRequest,
)
from django.utils.functional import cached_property
from django.utils.translation import gettext_lazy as _

from campaigns.models import (
    Campaign,
    Channel,
    EmailMessage,
)
from crm import tenancy
from crm.admin_lists import CheckedChangeList
from crm.tenancy import TenantAdmin
from integrations.whatsapp import errors as whatsapp_errors

# PostgreSQL's row count of a table as its planner sees it: the last ANALYZE's rows per page times the
# table's pages now (so rows added since are counted), without reading a single row. -1: never analyzed.
_ESTIMATED_ROWS_SQL = """
    SELECT CASE WHEN c.reltuples < 0 THEN -1
                WHEN c.relpages = 0 THEN c.reltuples
                ELSE c.reltuples / c.relpages * (pg_relation_size(c.oid) / current_setting('block_size')::int)
           END::bigint
    FROM pg_class c WHERE c.oid = to_regclass(%s)
"""


class CappedCountPaginator(Paginator):
    """Never counts a big table: the whole of a table is PostgreSQL's estimate of its rows (when above
    `cap`), a filtered list is counted up to `cap` + 1 rows (paging a day of a million customers, or a
    million messages, reads at most that many)."""

    cap = 10_000

    @cached_property
    def estimate(self) -> int | None:
        """The table's estimated rows if the list is the whole table and holds more than `cap`, else None."""
        rows = self.object_list
        if not isinstance(rows, QuerySet):
            return None
        query = rows.query
        if query.where or query.distinct or query.is_sliced or query.combinator or query.group_by is not None:
            return None
        connection = connections[rows.db]
        with connection.cursor() as cursor:
            cursor.execute(_ESTIMATED_ROWS_SQL, [connection.ops.quote_name(rows.model._meta.db_table)])
            row = cursor.fetchone()
        estimate = int(row[0]) if row and row[0] is not None else -1
        return estimate if estimate > self.cap else None

    @cached_property
    def count(self) -> int:
        if self.estimate is not None:
            return self.estimate
        rows = self.object_list
        # Unordered: any index holding the filtered columns can count them (the order is the page's).
        return rows.order_by()[: self.cap + 1].count() if isinstance(rows, QuerySet) else len(rows)

    def page(self, number: int | str) -> Page:
        """The page's rows by their primary keys, chosen in a subquery (one query still). The keys come
        from an index-only scan of the (filter, id) index, the offset included, which the planner picks
        for a bare SELECT id; for the whole rows it may walk the primary key backwards, filtering,
        because it thinks the rows of a big campaign are spread over the table (they are together, often
        far from the end), and an OFFSET would run the list's joins for every row skipped."""
        number = self.validate_number(number)
        rows = self.object_list
        if not isinstance(rows, QuerySet):
            return super().page(number)
        bottom = (number - 1) * self.per_page
        top = bottom + self.per_page
        if top + self.orphans >= self.count:
            top = self.count
        return Page(rows.filter(pk__in=rows.values("pk")[bottom:top]), number, self)

    @property
    def estimated(self) -> bool:
        return self.estimate is not None

    @property
    def capped(self) -> bool:
        return not self.estimated and self.count > self.cap


class BigTableChangeList(CheckedChangeList):
    """The search bar shows no "N results" when N is an estimate or the cap: the paginator says which."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        if getattr(self.paginator, "estimated", False) or getattr(self.paginator, "capped", False):
            self.full_result_count = self.result_count  # search_form shows a count only when they differ


class BigTableAdmin(TenantAdmin):
    """A list over a table of millions of rows: no full COUNT, no sort but the primary key's index, no
    facet counts, no bulk actions (a "select all" would load every row), and foreign keys as raw ids."""

    paginator = CappedCountPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    ordering = ("-id",)
    sortable_by = ("id",)
    actions = None

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return BigTableChangeList


def message_fields(model: type[models.Model]) -> tuple[str, ...]:
    """A message's fields as its page shows them (all read-only): whose and where it stands first,
    then the rest as the model declares them (the shared CampaignMessage fields, then the channel's);
    the error reason as its admin's `reason` shows it, in the page's language."""
    lead = ["id", "campaign", "organization", "customer", "status"]
    rest = (f.name for f in model._meta.fields if f.name not in lead)
    return (*lead, *("reason" if name == "error_reason" else name for name in rest))


class CampaignFilter(admin.SimpleListFilter):
    """The campaign, any one by id in the URL (?campaign__id__exact=), listing only the newest 20 of the
    list's channel (and the chosen one): never a choice per campaign."""

    title = _("campaign")
    parameter_name = "campaign__id__exact"
    newest = 20

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        channel = Channel.EMAIL if model_admin.model is EmailMessage else Channel.WHATSAPP
        visible = tenancy.scoped_related(model_admin.admin_site, Campaign, request)
        campaigns = list(
            visible.filter(channel=channel).order_by("-pk").values_list("pk", "name")[: self.newest]
        )
        chosen = self.value()
        if chosen and chosen.isdigit() and int(chosen) not in {pk for pk, _name in campaigns}:
            campaigns += visible.filter(pk=int(chosen)).values_list("pk", "name")
        return [(str(pk), f"{name} (#{pk})") for pk, name in campaigns]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        if not value:
            return queryset
        if not value.isdigit():
            raise IncorrectLookupParameters(f"campaign id {value!r}")
        return queryset.filter(campaign_id=int(value))


# What the sender does on each of Meta's errors, as the error-code filter says it.
ACTION_LABELS = {
    whatsapp_errors.Action.RETRY: _("retried"),
    whatsapp_errors.Action.THROTTLED: _("retried later (rate limit)"),
    whatsapp_errors.Action.DROP_RECIPIENT: _("recipient dropped"),
    whatsapp_errors.Action.OPT_OUT: _("customer opted out"),
    whatsapp_errors.Action.STOP_CAMPAIGN: _("campaign stopped"),
    whatsapp_errors.Action.STOP_ORGANIZATION: _("organization stopped"),
    whatsapp_errors.Action.PAUSE_NUMBER: _("number paused"),
}


class ErrorCodeFilter(admin.SimpleListFilter):
    """Meta's error code: the codes the sender knows, any other through the URL (?error_code__exact=).
    Django's default filter would list the codes with a SELECT DISTINCT over every message."""

    title = _("error code")
    parameter_name = "error_code__exact"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        known = sorted(whatsapp_errors.BY_CODE.items())
        return [(str(code), f"{code} · {ACTION_LABELS[action]}") for code, action in known]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        if not value:
            return queryset
        if not value.isdigit():
            raise IncorrectLookupParameters(f"error code {value!r}")
        return queryset.filter(error_code=int(value))
