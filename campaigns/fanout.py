"""The fan-out: one message per recipient, in batches, and one send job per batch."""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
from collections.abc import Generator
from dataclasses import dataclass, field
from datetime import datetime

from django.db import IntegrityError, connection, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from campaigns import caps, lift, selectors
from campaigns.lifecycle import Message, _batch_specs, _channel, _queued_batches, campaign_complete_if_done
from campaigns.models import (
    Campaign,
    CampaignMetric,
    Channel,
    Sender,
    WhatsappMessage,
)
from crm import bulk, recovery
from crm.models import Sale, Store
from integrations.models import WhatsappNumber

Status = Campaign.Status
logger = logging.getLogger(__name__)


def campaign_fanout(*, campaign_id: int, chunk: int = 20_000) -> int:
    """Create one message per recipient (idempotent) and enqueue one send job per batch.

    Each page of `chunk` recipients is one INSERT ... SELECT from the audience query: the rows
    are made in the database (tokens too), none goes through Python, so memory stays flat
    whatever the audience's size. Safe to run again after a crash: existing messages keep their
    batch, and only batches whose job is not alive in Redis are enqueued. Returns the number of
    recipients."""
    campaign = Campaign.objects.select_related("organization").get(pk=campaign_id)
    if campaign.status not in (Status.SENDING, Status.PAUSED):
        return 0
    model, _, _, _, size = _channel(campaign.channel)
    audience = selectors.campaign_audience(campaign=campaign)
    # An earlier (or concurrent) run wrote some: the pages leave out the messages that exist.
    again = model.objects.filter(campaign_id=campaign.pk).exists()
    plan = FanoutPlan(size=size, shares=batch_shares(campaign=campaign, size=size))
    with contextlib.closing(_pages(campaign, audience, chunk)) as pages:
        for page in pages:
            written = _fanout_page(campaign, model, page, plan=plan, again=again)
            if written is None:
                return 0  # the campaign was deleted meanwhile, its messages with it
            again = written[3]
    total = model.objects.filter(campaign_id=campaign.pk).count()
    # Or the send batches' claims are planned on the table as it was: the columns their queries
    # filter on, when the campaign changed the table's shape (a tenth of its rows or more; the
    # caps' statement does not depend on statistics, campaigns.caps).
    bulk.analyze_if_grown(model, total, _ANALYZED, share=0.1)
    # Its control group is counted apart (`held_out`): the progress is of what it sends.
    held = (
        model.objects.filter(campaign_id=campaign.pk, status=lift.HELD_OUT).count()
        if campaign.control_percent
        else 0
    )
    CampaignMetric.objects.filter(campaign_id=campaign.pk).update(queued=total - held)
    batches = _queued_batches(model, campaign.pk)
    recovery.requeue_missing(_batch_specs(campaign.pk, batches, campaign.channel, campaign.organization_id))
    logger.info(
        "campaign %s fanned out: %s recipients in %s batches",
        campaign.pk,
        total,
        len(batches),
        extra={"campaign_id": campaign.pk, "organization_id": campaign.organization_id},
    )
    if not batches:
        campaign_complete_if_done(campaign_id=campaign.pk)
    return total


_ANALYZED = ("campaign_id", "customer_id", "organization_id", "status", "batch", "sent_at")
_FANOUT_FIELDS = (
    "campaign_id",
    "organization_id",
    "customer_id",
    "batch",
    "token",
    "queued_at",
    "status",
    "error_reason",
)
# The page's rows: a recipient the contact caps (campaigns.caps) leave out is written SKIPPED with
# the reason; the others QUEUED, each numbered among the audience's queued ones of its sending
# number for its batch (FanoutPlan: the plan's rows give each number's share and how many of its
# messages the pages before wrote; a number not in it, `size` a batch; the size and the time as
# parameters). The link token: the page's random key (`campaign.token_key`, 11 characters of
# base64url: 8 bytes of a random UUID, 60 of their bits random, from the server's strong source, one
# draw a page) and the customer's id under the page's random mask (the last 8 bytes of another, 62 bits
# random) in 16 hex digits — unique, and a page's tokens side by side in the token index. A token
# per row drawn at random (models._token's) cost the INSERT half its time: the draws, and inserts
# scattered over an index larger than memory with history (docs/benchmarks.md).
# A link is the token signed (campaigns.links): it is not guessed, it is forged or not. No row
# without the campaign's. A queued one drawn into the control group (campaigns.lift:
# `random()` against Campaign.control_percent, after the caps) is written HELD_OUT instead, numbered
# into the batches with the others: its batch's send gives it its would-be send time.
_FANOUT_ROWS = (
    "SELECT campaign.id, campaign.organization_id, capped.customer_id, "
    "CASE WHEN capped.reason IS NULL THEN "
    "(coalesce(plan.earlier, 0) + row_number() OVER "
    "(PARTITION BY capped.reason IS NULL, capped.number_id ORDER BY capped.customer_id) - 1) "
    "/ coalesce(plan.share, %s) ELSE 0 END, "
    "campaign.token_key || lpad(to_hex(capped.customer_id # campaign.token_mask), 16, '0'), "
    "%s::timestamptz, "
    "CASE WHEN capped.reason IS NOT NULL THEN 'skipped' WHEN capped.held THEN 'held_out' ELSE 'queued' END, "
    "coalesce(capped.reason, ''){number} FROM capped CROSS JOIN campaign "
    "LEFT JOIN plan ON plan.number_id = coalesce(capped.number_id, 0)"
)

# The page's token key and mask (see _FANOUT_ROWS), drawn once with the campaign's row.
_PAGE_KEY_SQL = (
    "rtrim(translate(encode(substring(uuid_send(gen_random_uuid()) FROM 1 FOR 8), 'base64'), "
    "'+/', '-_'), '=') AS token_key, "
    "('x' || encode(substring(uuid_send(gen_random_uuid()) FROM 9 FOR 8), 'hex'))::bit(64)::bigint "
    "AS token_mask"
)


@dataclass
class FanoutPlan:
    """How the fan-out numbers a campaign's queued messages into send batches: each sending
    number's messages in audience order, `shares[number]` of them a batch (`size` for a number
    without a share), so that batch n holds the n-th share of every number; `written` counts each
    number's messages of the pages written so far. Number 0: no number (an email campaign's)."""

    size: int
    shares: dict[int, int] = field(default_factory=dict)
    written: dict[int, int] = field(default_factory=dict)

    def rows(self) -> tuple[list[int], list[int | None], list[int]]:
        """(number ids, their shares, their messages written) for the page's `plan` rows."""
        numbers = sorted(set(self.shares) | set(self.written))
        return numbers, [self.shares.get(n) for n in numbers], [self.written.get(n, 0) for n in numbers]


def batch_shares(*, campaign: Campaign, size: int) -> dict[int, int]:
    """Each paced number's messages per batch of a campaign that sends from its customers' stores,
    in proportion to its pace (WhatsappNumber.messages_per_second): `size` split over the numbers
    the campaign may send from, a number at half another's pace taking half as many (rounded down,
    one at least). All the numbers of a batch then take about as long to send their share, so one
    job keeps every number busy at its own pace instead of the slowest's, and a batch stays within
    `size` (what a killed worker can leave with an unknown outcome). An unpaced number is not in
    it (`size`).

    The numbers it may send from: its own and those the organization's stores send from."""
    if campaign.channel == Channel.EMAIL or campaign.sender != Sender.STORE:
        return {}  # one number: `size` a batch

    rates = dict(
        WhatsappNumber.objects.filter(
            Q(pk=campaign.whatsapp_number_id)
            | Q(organization_id=campaign.organization_id, sending_stores__isnull=False),
            messages_per_second__gt=0,
        ).values_list("pk", "messages_per_second")
    )
    if not rates:
        return {}
    total = sum(rates.values())
    return {pk: max(1, rate * size // total) for pk, rate in rates.items()}


def _sender_sql(campaign: Campaign) -> tuple[str, str]:
    """The WhatsApp number each message goes from: (its expression over `page` and `campaign`,
    what to join for it); NULL for an email.

    From the customer's store (Campaign.sender): the store of the customer's latest sale (one
    index probe of sale_customer_sold_at per customer), its number when it has one of the
    organization's, else the campaign's."""
    if campaign.channel == Channel.EMAIL:
        return "NULL::bigint", ""
    if campaign.sender != Sender.STORE:
        return "campaign.whatsapp_number_id", ""

    quote = connection.ops.quote_name
    sale, store, number = (quote(m._meta.db_table) for m in (Sale, Store, WhatsappNumber))
    join = (
        " LEFT JOIN LATERAL ("  # noqa: S608 - table names from the models' metadata
        f"SELECT sn.id AS number_id FROM {sale} sa JOIN {store} st ON st.id = sa.store_id "
        f"LEFT JOIN {number} sn ON sn.id = st.whatsapp_number_id AND sn.organization_id = st.organization_id "
        "WHERE sa.customer_id = page.customer_id ORDER BY sa.sold_at DESC, sa.id DESC LIMIT 1"
        ") AS latest ON true"
    )
    return "COALESCE(latest.number_id, campaign.whatsapp_number_id)", join


@dataclass(frozen=True)
class Page:
    """A page of the audience: its customer ids in ascending order, those the contact caps skip
    with the reason (campaigns.caps, checked at `now`)."""

    ids: list[int]
    capped: dict[int, str]
    now: datetime


def read_page(campaign: Campaign, page: QuerySet) -> Page:
    """The audience page `page` (its customers' ids, `values("pk")`) and its caps: two statements."""
    audience, audience_params = page.query.get_compiler(connection=connection).as_sql()
    with connection.cursor() as cursor:
        # A page's statements have a high estimated cost: PostgreSQL would spend more on compiling
        # them (JIT) than on running them.
        cursor.execute(f"SET LOCAL jit = off; {audience}", audience_params)
        cursor.nextset()
        ids = [row[0] for row in cursor.fetchall()]
    now = timezone.now()
    # The caps as a statement of their own, plan-stable (campaigns.caps), then joined to the page.
    return Page(ids, caps.skip_reasons(campaign=campaign, customer_ids=ids, now=now), now)


def _pages(campaign: Campaign, audience: QuerySet, chunk: int) -> Generator[Page]:
    """The audience's pages of `chunk` customers, in order, with their caps. The next page is read
    and its caps checked on a connection of its own (a thread's) while the caller writes this one:
    the caps' statement and the page's INSERT run side by side, on two cores (docs/benchmarks.md).
    Inside a transaction (a test's), one connection: another would not see its rows."""

    def read(after: int) -> Page:
        return read_page(campaign, audience.filter(pk__gt=after).order_by("pk").values("pk")[:chunk])

    if connection.in_atomic_block:
        page = read(0)
        yield page
        while len(page.ids) == chunk:
            page = read(page.ids[-1])
            yield page
        return
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fanout-pages") as reader:
        try:
            following: concurrent.futures.Future[Page] | None = reader.submit(read, 0)
            while following is not None:
                page = following.result()
                following = reader.submit(read, page.ids[-1]) if len(page.ids) == chunk else None
                yield page
        finally:
            # After the read in flight, if any: the thread's own connection closed, whatever happened.
            reader.submit(_close_connection)


def _close_connection() -> None:
    connection.close()  # the calling thread's (django.db.connection is per thread)


def _fanout_page(
    campaign: Campaign, model: type[Message], page: Page, *, plan: FanoutPlan, again: bool
) -> tuple[int, int, int, bool] | None:
    """Write the messages of one page of the audience, numbered into batches by `plan`, which
    then counts them: one statement, one transaction. Returns (recipients read, recipients queued —
    the others the contact caps skipped —, the last one's id, whether some messages existed
    already), or None when the campaign is gone.

    A straight INSERT when no message of the campaign existed; ON CONFLICT DO NOTHING when an
    earlier run wrote some, or when a concurrent run wrote some meanwhile (the straight INSERT
    then fails on the unique constraint and the page is written again)."""
    if not again:
        try:
            with transaction.atomic():
                return _insert_page(campaign, model, page, plan=plan, ignore=False)
        except IntegrityError:
            pass
    with transaction.atomic():
        return _insert_page(campaign, model, page, plan=plan, ignore=True)


def _insert_page(
    campaign: Campaign, model: type[Message], page: Page, *, plan: FanoutPlan, ignore: bool
) -> tuple[int, int, int, bool] | None:
    number, sender = _sender_sql(campaign)
    whatsapp = model is WhatsappMessage
    fields = (*_FANOUT_FIELDS, "whatsapp_number_id") if whatsapp else _FANOUT_FIELDS
    rows = _FANOUT_ROWS.format(number=", capped.number_id" if whatsapp else "")
    insert, defaults = bulk.insert_select(model, fields, rows, ignore_conflicts=ignore)
    ids, capped, now = page.ids, page.capped, page.now
    # Each skip as its reason's number among the page's few reasons (the statement's parameters are
    # written into its text: a reason each would be 20,000 quoted strings to write and to parse).
    reasons = sorted(set(capped.values()))
    numbered = {reason: n for n, reason in enumerate(reasons, start=1)}
    # The campaign's row FOR KEY SHARE, what the foreign key's check would take on every row, once:
    # it cannot be deleted while the page is written (models.MESSAGE_FKS, campaign_deleting).
    # The INSERT's SQL from the model's metadata: values are parameters. Per page, not per run:
    # each page commits on its own, with the count of the recipients it skipped (only the rows it
    # wrote: a re-run counts none twice).
    sql = (
        f"WITH campaign AS (SELECT id, organization_id, whatsapp_number_id, {_PAGE_KEY_SQL} "  # noqa: S608
        f"FROM {Campaign._meta.db_table} WHERE id = %s FOR KEY SHARE), "
        "page (customer_id, reason) AS MATERIALIZED (SELECT given.id, (%s::text[])[skip.reason] "
        "FROM unnest(%s::bigint[]) AS given(id) LEFT JOIN unnest(%s::bigint[], %s::int[]) "
        "AS skip(id, reason) ON skip.id = given.id), "
        f"capped AS MATERIALIZED (SELECT page.customer_id, page.reason, {number} AS number_id, "
        "page.reason IS NULL AND random() * 100 < %s AS held "
        f"FROM page CROSS JOIN campaign{sender}), "
        "plan (number_id, share, earlier) AS "
        "(SELECT * FROM unnest(%s::bigint[], %s::bigint[], %s::bigint[])), "
        f"written AS ({insert} RETURNING status), "
        f"counted AS (UPDATE {CampaignMetric._meta.db_table} SET skipped = skipped + "
        "(SELECT count(*) FROM written WHERE status = 'skipped') WHERE campaign_id = %s RETURNING 1) "
        "SELECT (SELECT count(*) FROM campaign), (SELECT count(*) FROM capped WHERE reason IS NULL), "
        "(SELECT count(*) FROM counted), "
        "(SELECT array_agg(ARRAY[coalesce(number_id, 0), n]) FROM "
        "(SELECT number_id, count(*) AS n FROM capped WHERE reason IS NULL GROUP BY number_id) AS queued)"
    )
    params = [
        campaign.pk,
        reasons,
        ids,
        list(capped),
        [numbered[r] for r in capped.values()],
        campaign.control_percent,
        *plan.rows(),
        *defaults,
        plan.size,
        now,
        campaign.pk,
    ]
    with connection.cursor() as cursor:
        cursor.execute(f"SET LOCAL jit = off; {sql}", params)
        cursor.nextset()
        found, queued, _, per_number = cursor.fetchone()
    if not found:
        return None
    for number_id, n in per_number or []:
        plan.written[number_id] = plan.written.get(number_id, 0) + n
    return len(ids), int(queued), max(ids, default=0), ignore
