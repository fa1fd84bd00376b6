"""Every write on campaigns: start, fan-out, cancel, pause, resume, retry, completion."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction
from django.db.models import Count, F, Q, QuerySet
from django.utils import timezone
from django.utils.translation import gettext as _

from campaigns import audience, caps, lift, links, selectors
from campaigns.models import (
    CONTENT_COLUMNS,
    OUTCOME_UNKNOWN,
    BounceType,
    Campaign,
    CampaignMetric,
    Channel,
    EmailMessage,
    Kind,
    Sender,
    WhatsappMessage,
)
from crm import bulk, jobs, promote, queues, recovery
from crm.checkpoints import jobrun_enqueue
from crm.crypto import DecryptionError
from integrations.services import whatsapp_price_currency

logger = logging.getLogger(__name__)

Status = Campaign.Status
MsgStatus = WhatsappMessage.Status


class CampaignError(ValueError):
    """An operator action that does not apply to the campaign as it is."""


class EmptyAudience(CampaignError):
    """Nobody would receive the campaign (the message says why): it does not start."""


Message = WhatsappMessage | EmailMessage


# How each channel's messages are sent: (message model, send job, queue, job id prefix, batch size).
def _channel(channel: str) -> tuple[type[Message], str, str, str, int]:
    if channel == Channel.EMAIL:
        return (
            EmailMessage,
            "campaigns.tasks.email_send_batch",
            queues.EMAIL_SEND,
            "em",
            int(settings.EMAIL_BATCH_SIZE),
        )
    return (
        WhatsappMessage,
        "campaigns.tasks.whatsapp_send_batch",
        queues.WHATSAPP_SEND,
        "wa",
        int(settings.WHATSAPP_BATCH_SIZE),
    )


def _channel_of(campaign_id: int) -> str:
    return (
        Campaign.objects.filter(pk=campaign_id).values_list("channel", flat=True).first() or Channel.WHATSAPP
    )


def batch_job_id(campaign_id: int, batch: int, channel: str = Channel.WHATSAPP) -> str:
    return jobs.make_job_id(_channel(channel)[3], campaign_id, batch)


# Fields whose values every message is built from: their validators are checked again at the start
# (a value saved before a validator existed would fail every send).
_SEND_FIELDS = frozenset({"audience_purchased_within_days", "email_subject"})


def campaign_validate(*, campaign: Campaign) -> None:
    """Raise CampaignError when the campaign cannot be sent as configured."""
    try:
        campaign.clean_fields(exclude={f.name for f in Campaign._meta.fields if f.name not in _SEND_FIELDS})
    except ValidationError as exc:
        raise CampaignError(
            "; ".join(f"{field}: {' '.join(errors)}" for field, errors in exc.message_dict.items())
        ) from None
    if campaign.channel == Channel.EMAIL:
        _validate_email(campaign)
        return
    if campaign.whatsapp_number_id is None:
        raise CampaignError(_("choose the WhatsApp number to send from"))
    if not campaign.template_name:
        raise CampaignError(_("the template name is required"))
    from campaigns.variables import VARIABLE_SOURCES

    unknown = [v for v in campaign.template_variables if v not in VARIABLE_SOURCES]
    if unknown:
        raise CampaignError(
            _("unknown template variable source(s): %(unknown)s; use %(known)s")
            % {"unknown": ", ".join(map(str, unknown)), "known": ", ".join(VARIABLE_SOURCES)}
        )
    if campaign.redirect_button_index is not None and not campaign.redirect_url:
        raise CampaignError(_("a redirect button needs a redirect URL"))
    from campaigns.composer import template_problem

    problem = template_problem(campaign)
    if problem:
        raise CampaignError(problem)


def _validate_email(campaign: Campaign) -> None:
    from integrations.models import EmailSettings
    from messaging import email_render

    email_settings = EmailSettings.objects.filter(organization_id=campaign.organization_id).first()
    if email_settings is None:
        raise CampaignError(_("the organization has no email settings: add them under Integrations"))
    try:
        email_settings.clean_fields(
            exclude={f.name for f in EmailSettings._meta.fields if f.name != "sender_name"}
        )
    except ValidationError as exc:
        raise CampaignError(
            _("the email settings' sender name: %(error)s") % {"error": " ".join(exc.messages)}
        ) from None
    try:
        email_render.compile_email(
            subject=campaign.email_subject, body=campaign.email_body, body_format=campaign.email_body_format
        )
    except email_render.TemplateError as exc:
        raise CampaignError(str(exc)) from None


def campaign_start(*, campaign: Campaign) -> Campaign:
    """Move a draft or scheduled campaign to sending and enqueue its fan-out; returns at once.
    EmptyAudience when nobody would receive it (never "sent" to nobody)."""
    campaign_validate(campaign=campaign)
    problem = audience.audience_problem(campaign=campaign)
    if problem:
        raise EmptyAudience(problem)
    with transaction.atomic():
        now = timezone.now()
        # The row locked, its content read fresh: the links frozen are those of what is sent.
        fresh = Campaign.objects.select_for_update().filter(pk=campaign.pk).first()
        updated = Campaign.objects.filter(pk=campaign.pk, status__in=[Status.DRAFT, Status.SCHEDULED]).update(
            status=Status.SENDING,
            started_at=now,
            finished_at=None,
            stop_reason="",
            sent_links=links.link_targets(campaign=fresh) if fresh is not None else None,
        )
        if not updated:
            campaign.refresh_from_db()
            raise CampaignError(
                _("campaign %(id)s is %(status)s; only a draft or scheduled campaign can start")
                % {"id": campaign.pk, "status": campaign.get_status_display()}
            )
        # Its costs add up in the rate card's currency as it is now (one currency per total).
        CampaignMetric.objects.get_or_create(
            campaign=campaign, defaults={"cost_currency": whatsapp_price_currency()}
        )
        jobrun_enqueue(
            kind="campaign-fanout",
            key=str(campaign.pk),
            func="campaigns.tasks.campaign_fanout",
            queue=queues.CAMPAIGN_TRIGGER,
            kwargs={"campaign_id": campaign.pk},
            organization_id=campaign.organization_id,
        )
    campaign.refresh_from_db()
    return campaign


def trigger_job_id(campaign_id: int) -> str:
    return jobs.make_job_id("campaign", campaign_id)


def campaign_schedule(*, campaign: Campaign, at: datetime) -> Campaign:
    """Schedule (or reschedule) a draft/scheduled campaign to start at `at`.

    One delayed job with the fixed id campaign-<id> on campaign-trigger: rescheduling replaces
    it, so there are never two."""
    if timezone.is_naive(at):
        raise CampaignError(_("the schedule needs a time zone"))
    if at <= timezone.now():
        raise CampaignError(_("the scheduled time is in the past; start it now instead"))
    campaign_validate(campaign=campaign)
    with transaction.atomic():
        if not Campaign.objects.filter(pk=campaign.pk, status__in=[Status.DRAFT, Status.SCHEDULED]).update(
            status=Status.SCHEDULED, scheduled_at=at
        ):
            campaign.refresh_from_db()
            raise CampaignError(
                _("campaign %(id)s is %(status)s; only a draft can be scheduled")
                % {"id": campaign.pk, "status": campaign.get_status_display()}
            )
        jobs.enqueue(
            "campaigns.tasks.campaign_trigger",
            queue=queues.CAMPAIGN_TRIGGER,
            kwargs={"campaign_id": campaign.pk},
            job_id=trigger_job_id(campaign.pk),
            replace=True,
            at=at,
            organization_id=campaign.organization_id,
        )
    campaign.refresh_from_db()
    return campaign


def campaign_unschedule(*, campaign: Campaign) -> None:
    """Back to draft; the delayed start is removed."""
    Campaign.objects.filter(pk=campaign.pk, status=Status.SCHEDULED).update(
        status=Status.DRAFT, scheduled_at=None
    )
    jobs.delete_job(trigger_job_id(campaign.pk))
    campaign.refresh_from_db()


@recovery.register("campaign-triggers")
def _scheduled_starts() -> Iterator[jobs.JobSpec]:
    """Scheduled campaigns whose delayed start Redis no longer holds (due ones start at once)."""
    scheduled = Campaign.objects.filter(status=Status.SCHEDULED).values_list(
        "pk", "scheduled_at", "organization_id"
    )
    for pk, at, organization_id in scheduled:
        yield jobs.JobSpec(
            func="campaigns.tasks.campaign_trigger",
            queue=queues.CAMPAIGN_TRIGGER,
            kwargs={"campaign_id": pk},
            job_id=trigger_job_id(pk),
            at=at if at and at > timezone.now() else None,
            organization_id=organization_id,
        )


def _batch_specs(
    campaign_id: int, batches: list[int], channel: str, organization_id: int | None
) -> list[jobs.JobSpec]:
    _, func, queue, _, _ = _channel(channel)
    return [
        jobs.JobSpec(
            func=func,
            queue=queue,
            kwargs={"campaign_id": campaign_id, "batch": b},
            job_id=batch_job_id(campaign_id, b, channel),
            organization_id=organization_id,
        )
        for b in batches
    ]


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
    plan = BatchPlan(size=size, shares=batch_shares(campaign=campaign, size=size))
    after = 0
    while True:
        page = audience.filter(pk__gt=after).order_by("pk").values("pk")[:chunk]
        written = _fanout_page(campaign, model, page, plan=plan, again=again)
        if written is None:
            return 0  # the campaign was deleted meanwhile, its messages with it
        read, _, after, again = written
        if read < chunk:
            break
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
# number for its batch (BatchPlan: the plan's rows give each number's share and how many of its
# messages the pages before wrote; a number not in it, `size` a batch; the size and the time as
# parameters). The link token as models._token makes it (secrets.token_urlsafe(16): 22 characters
# of base64url), from the 16 bytes of a random UUID (122 of them random, from the server's strong
# source). No row without the campaign's. A queued one drawn into the control group (campaigns.lift:
# `random()` against Campaign.control_percent, after the caps) is written HELD_OUT instead, numbered
# into the batches with the others: its batch's send gives it its would-be send time.
_FANOUT_ROWS = (
    "SELECT campaign.id, campaign.organization_id, capped.customer_id, "
    "CASE WHEN capped.reason IS NULL THEN "
    "(coalesce(plan.earlier, 0) + row_number() OVER "
    "(PARTITION BY capped.reason IS NULL, capped.number_id ORDER BY capped.customer_id) - 1) "
    "/ coalesce(plan.share, %s) ELSE 0 END, "
    "rtrim(translate(encode(uuid_send(gen_random_uuid()), 'base64'), '+/', '-_'), '='), "
    "%s::timestamptz, "
    "CASE WHEN capped.reason IS NOT NULL THEN 'skipped' WHEN capped.held THEN 'held_out' ELSE 'queued' END, "
    "coalesce(capped.reason, ''){number} FROM capped CROSS JOIN campaign "
    "LEFT JOIN plan ON plan.number_id = coalesce(capped.number_id, 0)"
)


@dataclass
class BatchPlan:
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
    from integrations.models import WhatsappNumber

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
    from crm.models import Sale, Store
    from integrations.models import WhatsappNumber

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


def _fanout_page(
    campaign: Campaign, model: type[Message], page: QuerySet, *, plan: BatchPlan, again: bool
) -> tuple[int, int, int, bool] | None:
    """Write the messages of one page of the audience (customer ids in ascending order), numbered
    into batches by `plan`, which then counts them: one statement, one transaction. Returns
    (recipients read, recipients queued — the others the contact caps skipped —, the last one's
    id, whether some messages existed already), or None when the campaign is gone.

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
    campaign: Campaign, model: type[Message], page: QuerySet, *, plan: BatchPlan, ignore: bool
) -> tuple[int, int, int, bool] | None:
    audience, audience_params = page.query.get_compiler(connection=connection).as_sql()
    number, sender = _sender_sql(campaign)
    whatsapp = model is WhatsappMessage
    fields = (*_FANOUT_FIELDS, "whatsapp_number_id") if whatsapp else _FANOUT_FIELDS
    rows = _FANOUT_ROWS.format(number=", capped.number_id" if whatsapp else "")
    insert, defaults = bulk.insert_select(model, fields, rows, ignore_conflicts=ignore)
    now = timezone.now()
    with connection.cursor() as cursor:
        # A page's INSERT has a high estimated cost: PostgreSQL would spend more on compiling it
        # (JIT) than on running it.
        cursor.execute(f"SET LOCAL jit = off; {audience}", audience_params)
        cursor.nextset()
        ids = [row[0] for row in cursor.fetchall()]
    # The caps as a statement of their own, plan-stable (campaigns.caps), then joined to the page.
    capped = caps.skip_reasons(campaign=campaign, customer_ids=ids, now=now)
    # The campaign's row FOR KEY SHARE, what the foreign key's check would take on every row, once:
    # it cannot be deleted while the page is written (models.MESSAGE_FKS, campaign_deleting).
    # The INSERT's SQL from the model's metadata: values are parameters. Per page, not per run:
    # each page commits on its own, with the count of the recipients it skipped (only the rows it
    # wrote: a re-run counts none twice).
    sql = (
        f"WITH campaign AS (SELECT id, organization_id, whatsapp_number_id "  # noqa: S608
        f"FROM {Campaign._meta.db_table} WHERE id = %s FOR KEY SHARE), "
        "page (customer_id, reason) AS MATERIALIZED (SELECT given.id, skip.reason "
        "FROM unnest(%s::bigint[]) AS given(id) LEFT JOIN unnest(%s::bigint[], %s::text[]) "
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
        ids,
        list(capped),
        list(capped.values()),
        campaign.control_percent,
        *plan.rows(),
        *defaults,
        plan.size,
        now,
        campaign.pk,
    ]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        found, queued, _, per_number = cursor.fetchone()
    if not found:
        return None
    for number_id, n in per_number or []:
        plan.written[number_id] = plan.written.get(number_id, 0) + n
    return len(ids), int(queued), max(ids, default=0), ignore


def campaign_archive(*, campaign: Campaign) -> bool:
    """Hide the campaign from the default list, keeping its messages and credited sales; True when this
    call archived it. A campaign still sending (or paused) is refused: cancel it first."""
    if campaign.status in (Status.SENDING, Status.PAUSED):
        raise CampaignError(
            _("campaign %(id)s is %(status)s; cancel it before archiving")
            % {"id": campaign.pk, "status": campaign.get_status_display()}
        )
    return bool(
        Campaign.objects.filter(pk=campaign.pk, archived_at__isnull=True)
        .exclude(status__in=[Status.SENDING, Status.PAUSED])
        .update(archived_at=timezone.now())
    )


def campaign_unarchive(*, campaign: Campaign) -> bool:
    """Show an archived campaign in the default list again; True when this call did it."""
    return bool(Campaign.objects.filter(pk=campaign.pk, archived_at__isnull=False).update(archived_at=None))


def campaign_has_messages(*, campaign: Campaign) -> bool:
    """Whether any message was written for the campaign (then it is history: archived, never deleted)."""
    return campaign.message_model.objects.filter(campaign_id=campaign.pk).exists()


def campaign_deleting(sender: type[Campaign], instance: Campaign, **kwargs: object) -> None:
    """pre_delete of a campaign, inside the deletion's transaction: its row locked before its
    messages are deleted. A fan-out page holds the row FOR KEY SHARE while it writes (the message
    rows have no foreign-key constraint to do it, see models.MESSAGE_FKS): a page under way
    finishes first and its messages are deleted with the others, and the next page finds the
    campaign gone."""
    list(Campaign.objects.select_for_update().filter(pk=instance.pk).values_list("pk", flat=True))


CUSTOMER_DELETED = "customer deleted"


def skip_without_customer(*, model: type[Message], campaign_id: int, ids: list[int], found: list) -> int:
    """Claimed messages (`ids`) that their customer's join left out of `found`: the customer was
    deleted while the fan-out wrote them (no foreign-key constraint, models.MESSAGE_FKS). They are
    SKIPPED and counted, so that the campaign completes. Returns how many."""
    gone = set(ids).difference(m.pk for m in found)
    if not gone:
        return 0
    with transaction.atomic():
        skipped = model.objects.filter(id__in=gone, status=MsgStatus.SENDING).update(
            status=MsgStatus.SKIPPED, error_reason=CUSTOMER_DELETED
        )
        CampaignMetric.objects.filter(campaign_id=campaign_id).update(skipped=F("skipped") + skipped)
    return skipped


def _queued_batches(model: type[Message], campaign_id: int) -> list[int]:
    return list(
        model.objects.filter(campaign_id=campaign_id, status=MsgStatus.QUEUED)
        .order_by("batch")
        .values_list("batch", flat=True)
        .distinct()
    )


PAUSED_DELAY = 30.0  # how often a paused campaign's batch looks again (twice that for a paused organization)


def batch_may_send(*, campaign: Campaign, batch: int) -> bool:
    """What every send batch checks first, with the campaign and its organization loaded.

    False when there is nothing to send: a cancelled or stopped campaign (the batch's queued
    messages are cancelled) or one not sending. Raises Defer (no attempt spent) while the campaign
    is paused or the organization's sending on the channel is paused."""
    model = _channel(campaign.channel)[0]
    if campaign.status in (Status.CANCELLED, Status.STOPPED):
        model.objects.filter(campaign_id=campaign.pk, batch=batch, status=MsgStatus.QUEUED).update(
            status=MsgStatus.CANCELLED
        )
        return False
    if campaign.status == Status.PAUSED:
        raise jobs.Defer(PAUSED_DELAY, "campaign paused")
    # Not sending_paused: a number Meta paused holds only its own messages, which the send job leaves.
    paused = selectors.organization_paused(campaign=campaign)
    if paused:
        raise jobs.Defer(PAUSED_DELAY * 2, f"organization's {campaign.channel} sending paused: {paused}")
    return campaign.status == Status.SENDING


def campaign_complete_if_done(*, campaign_id: int, channel: str | None = None) -> bool:
    """SENDING -> SENT when no message is queued or in flight. Safe to call any time, twice."""
    model = _channel(channel or _channel_of(campaign_id))[0]
    busy = model.objects.filter(campaign_id=campaign_id, status__in=model.IN_FLIGHT).exists()
    if busy:
        return False
    with transaction.atomic():
        # A flow step's campaign sends for as long as its flow lives.
        done = (
            Campaign.objects.filter(pk=campaign_id, status=Status.SENDING)
            .exclude(kind=Kind.FLOW)
            .update(status=Status.SENT, finished_at=timezone.now())
        )
        if done:  # held out in a batch that had nothing to send: their window starts now
            lift.held_out_stamp(model=model, campaign_id=campaign_id, batch=None)
    return bool(done)


def _cancel_queued(campaign_id: int) -> int:
    return sum(
        model.objects.filter(campaign_id=campaign_id, status=MsgStatus.QUEUED).update(
            status=MsgStatus.CANCELLED
        )
        for model in (WhatsappMessage, EmailMessage)
    )


def campaign_cancel(*, campaign: Campaign) -> int:
    """Cancel a campaign: its queued messages are never sent. Returns how many were cancelled."""
    with transaction.atomic():
        updated = Campaign.objects.filter(
            pk=campaign.pk, status__in=[Status.DRAFT, Status.SCHEDULED, Status.SENDING, Status.PAUSED]
        ).update(status=Status.CANCELLED, finished_at=timezone.now())
        if not updated:
            campaign.refresh_from_db()
            raise CampaignError(
                _("campaign %(id)s is %(status)s; it cannot be cancelled")
                % {"id": campaign.pk, "status": campaign.get_status_display()}
            )
        cancelled = _cancel_queued(campaign.pk)
    jobs.delete_job(trigger_job_id(campaign.pk))  # a scheduled start, if any
    campaign.refresh_from_db()
    return cancelled


def campaign_stop(*, campaign_id: int, reason: str) -> None:
    """The campaign itself cannot be sent (a provider refused its template, its number's token
    cannot be read…): stopped with the reason, its queued messages cancelled."""
    with transaction.atomic():
        if Campaign.objects.filter(
            pk=campaign_id, status__in=[Status.SCHEDULED, Status.SENDING, Status.PAUSED]
        ).update(status=Status.STOPPED, stop_reason=reason, finished_at=timezone.now()):
            _cancel_queued(campaign_id)
            logger.warning("campaign %s stopped: %s", campaign_id, reason, extra={"campaign_id": campaign_id})


def campaign_start_or_stop(*, campaign: Campaign) -> Campaign:
    """Start a campaign no one is watching (its schedule, a recurrence): when nobody would receive
    it, it is stopped with the reason instead, never left waiting nor "sent" to nobody."""
    try:
        return campaign_start(campaign=campaign)
    except EmptyAudience as exc:
        Campaign.objects.filter(pk=campaign.pk, status__in=[Status.DRAFT, Status.SCHEDULED]).update(
            status=Status.STOPPED, stop_reason=str(exc), finished_at=timezone.now()
        )
        logger.warning("campaign %s not started: %s", campaign.pk, exc, extra={"campaign_id": campaign.pk})
        campaign.refresh_from_db()
        return campaign


def campaign_pause(*, campaign: Campaign) -> None:
    if not Campaign.objects.filter(pk=campaign.pk, status=Status.SENDING).update(status=Status.PAUSED):
        campaign.refresh_from_db()
        raise CampaignError(
            _("campaign %(id)s is %(status)s; only a sending campaign pauses")
            % {"id": campaign.pk, "status": campaign.get_status_display()}
        )
    campaign.refresh_from_db()


def campaign_resume(*, campaign: Campaign) -> None:
    if not Campaign.objects.filter(pk=campaign.pk, status=Status.PAUSED).update(status=Status.SENDING):
        campaign.refresh_from_db()
        raise CampaignError(
            _("campaign %(id)s is %(status)s; only a paused campaign resumes")
            % {"id": campaign.pk, "status": campaign.get_status_display()}
        )
    campaign.refresh_from_db()
    requeue_unfinished_batches(campaign_id=campaign.pk)


def campaign_retry_failed(*, campaign: Campaign) -> int:
    """Queue the failed messages again (fresh attempts) and reopen the campaign. Returns how many."""
    with transaction.atomic():
        if campaign.channel == Channel.EMAIL:
            # Failed ones, soft bounces and policy blocks (the block may be lifted: the address was
            # never in question); hard bounces are suppressed; never an outcome unknown.
            mail = EmailMessage.objects.filter(campaign_id=campaign.pk).exclude(error_reason=OUTCOME_UNKNOWN)
            reset = {"status": MsgStatus.QUEUED, "attempts": 0, "error_reason": "", "failed_at": None}
            failed = mail.filter(status=EmailMessage.Status.FAILED).update(**reset)
            soft = mail.filter(status=EmailMessage.Status.BOUNCED, bounce_type=BounceType.SOFT).update(
                **reset, bounce_type="", bounce_message=""
            )
            # A block the ESP reported came after the send was counted: that count goes with it.
            blocked_after_send = mail.filter(
                status=EmailMessage.Status.BLOCKED, sent_at__isnull=False
            ).update(**reset, bounce_message="", sent_at=None, esp_message_id=None)
            blocked = blocked_after_send + mail.filter(status=EmailMessage.Status.BLOCKED).update(
                **reset, bounce_message=""
            )
            retried = failed + soft + blocked
            if retried:
                CampaignMetric.objects.filter(campaign_id=campaign.pk).update(
                    failed=F("failed") - failed,
                    bounced=F("bounced") - soft,
                    blocked=F("blocked") - blocked,
                    sent=F("sent") - blocked_after_send,
                )
        else:
            # Not the ones Meta may have accepted: an outcome unknown, or a wamid already assigned.
            retried = (
                WhatsappMessage.objects.filter(
                    campaign_id=campaign.pk, status=MsgStatus.FAILED, wamid__isnull=True
                )
                .exclude(error_reason=OUTCOME_UNKNOWN)
                .update(status=MsgStatus.QUEUED, attempts=0, error_code=None, error_reason="", failed_at=None)
            )
            if retried:
                CampaignMetric.objects.filter(campaign_id=campaign.pk).update(failed=F("failed") - retried)
        if retried:
            Campaign.objects.filter(pk=campaign.pk, status__in=[Status.SENT, Status.STOPPED]).update(
                status=Status.SENDING, finished_at=None, stop_reason=""
            )
    if retried:
        requeue_unfinished_batches(campaign_id=campaign.pk)
    campaign.refresh_from_db()
    return retried


def requeue_unfinished_batches(*, campaign_id: int) -> int:
    """Run now the batches that still have queued messages: waiting ones are pulled forward and
    the ones without a live job are enqueued. Returns how many were (re)started."""
    channel, organization_id = Campaign.objects.filter(pk=campaign_id).values_list(
        "channel", "organization_id"
    ).first() or (Channel.WHATSAPP, None)
    model, _, queue, _, _ = _channel(channel)
    specs = _batch_specs(campaign_id, _queued_batches(model, campaign_id), channel, organization_id)
    pulled = promote.promote_now(queue, [s.job_id or "" for s in specs])
    return pulled + recovery.requeue_missing(specs)


def _unfinished(channel: str) -> Iterator[jobs.JobSpec]:
    # Campaign by campaign: each one's queued batches are a range of one index (no index holds
    # the queued messages of every campaign: the fan-out would write it for each message).
    model = _channel(channel)[0]
    active = (
        Campaign.objects.filter(channel=channel, status__in=[Status.SENDING, Status.PAUSED])
        .order_by("pk")
        .values_list("pk", "organization_id")
    )
    for campaign_id, organization_id in active.iterator(chunk_size=2000):
        yield from _batch_specs(campaign_id, _queued_batches(model, campaign_id), channel, organization_id)


# Errors that say the campaign's own configuration is broken: giving up stops the campaign.
CONFIGURATION_ERRORS: tuple[type[BaseException], ...] = (DecryptionError,)


def batch_give_up(
    *, channel: str, campaign_id: int, batch: int, reason: str, error: BaseException | None
) -> int:
    """A send batch that cannot succeed ends: its queued messages FAILED with the reason (counted,
    the campaign completes), or the campaign stopped when its configuration is the cause.
    Returns the messages failed. Safe to call twice."""
    if isinstance(error, CONFIGURATION_ERRORS):
        campaign_stop(campaign_id=campaign_id, reason=reason)
        return 0
    model = _channel(channel)[0]
    with transaction.atomic():
        failed = model.objects.filter(campaign_id=campaign_id, batch=batch, status=MsgStatus.QUEUED).update(
            status=MsgStatus.FAILED, failed_at=timezone.now(), error_reason=reason
        )
        CampaignMetric.objects.filter(campaign_id=campaign_id).update(failed=F("failed") + failed)
    campaign_complete_if_done(campaign_id=campaign_id, channel=channel)
    return failed


@recovery.gives_up("campaigns.tasks.whatsapp_send_batch")
def _whatsapp_batch_given_up(kwargs: dict, reason: str, error: BaseException | None) -> None:
    batch_give_up(channel=Channel.WHATSAPP, reason=reason, error=error, **kwargs)


@recovery.gives_up("campaigns.tasks.email_send_batch")
def _email_batch_given_up(kwargs: dict, reason: str, error: BaseException | None) -> None:
    batch_give_up(channel=Channel.EMAIL, reason=reason, error=error, **kwargs)


@recovery.gives_up("campaigns.tasks.campaign_fanout")
def _fanout_given_up(kwargs: dict, reason: str, error: BaseException | None) -> None:
    """A fan-out that cannot succeed stops its campaign (it would stay `sending` with no messages)."""
    campaign_stop(campaign_id=kwargs["campaign_id"], reason=reason)


@recovery.gives_up("campaigns.tasks.campaign_trigger")
def _trigger_given_up(kwargs: dict, reason: str, error: BaseException | None) -> None:
    campaign_stop(campaign_id=kwargs["campaign_id"], reason=reason)


@recovery.register("whatsapp-batches")
def _unfinished_batches() -> Iterator[jobs.JobSpec]:
    """Every batch of a sending WhatsApp campaign that still has queued messages."""
    return _unfinished(Channel.WHATSAPP)


@recovery.register("email-batches")
def _unfinished_email_batches() -> Iterator[jobs.JobSpec]:
    """Every batch of a sending email campaign that still has queued messages."""
    return _unfinished(Channel.EMAIL)


def reconcile_in_flight(*, older_than_seconds: int | None = None) -> int:
    """Settle messages stuck in SENDING (their worker died after claiming them).

    Their outcome is unknown (the provider may have accepted them), and they are never sent again,
    because a second send is worse than a missing one. A WhatsApp message becomes UNKNOWN (counted
    in `unknown`, not failed): Meta may still report it, and a late status webhook moves it to
    sent, delivered, read or failed. An email is FAILED with that reason (SMTP reports nothing
    later). Either way the campaign can complete. Returns how many were settled.
    """
    limit = older_than_seconds if older_than_seconds is not None else settings.WHATSAPP_IN_FLIGHT_TIMEOUT
    cutoff = timezone.now() - timedelta(seconds=limit)
    settled = 0
    for channel in (Channel.WHATSAPP, Channel.EMAIL):
        model = _channel(channel)[0]
        settle: dict[str, object]
        if channel == Channel.WHATSAPP:
            settle, counter = {"status": MsgStatus.UNKNOWN}, "unknown"
        else:
            settle, counter = {"status": MsgStatus.FAILED, "failed_at": timezone.now()}, "failed"
        stuck = model.objects.filter(status=MsgStatus.SENDING, sending_at__lt=cutoff)
        campaign_ids = [c for c, _ in stuck.values_list("campaign_id").annotate(n=Count("id")).order_by()]
        for campaign_id in campaign_ids:
            with transaction.atomic():
                n = model.objects.filter(
                    campaign_id=campaign_id, status=MsgStatus.SENDING, sending_at__lt=cutoff
                ).update(**settle, error_reason=OUTCOME_UNKNOWN)
                CampaignMetric.objects.filter(campaign_id=campaign_id).update(**{counter: F(counter) + n})
            settled += n
            campaign_complete_if_done(campaign_id=campaign_id, channel=channel)
    return settled


# --- Recurring campaigns ---------------------------------------------------------------------------

RECURRING_LOCK_TTL = 300  # the seed's SET NX EX 300 around a dispatch pass
# An occurrence is "missed" when the dispatch finds it later than this (the pass runs every 5
# minutes, so a live system is never this late); the campaign's misfire policy then applies.
MISFIRE_GRACE = timedelta(minutes=10)
_COPIED_FIELDS = ("organization_id", *CONTENT_COLUMNS)


def _occurrences(campaign: Campaign, *, after: datetime, until: datetime) -> list[datetime]:
    """The cron's occurrences in (after, until], computed in the organization's time zone."""
    from zoneinfo import ZoneInfo

    from croniter import croniter

    zone = ZoneInfo(campaign.organization.timezone)
    it = croniter(campaign.recurrence, after.astimezone(zone))
    found: list[datetime] = []
    while True:
        nxt = it.get_next(datetime)
        if nxt > until:
            return found
        found.append(nxt)
        if len(found) > 10_000:  # "* * * * *" down for a week: only the last one matters anyway
            found = found[-1:]


def occurrence_key(campaign_id: int, at: datetime) -> str:
    return f"{campaign_id}@{at.astimezone(UTC):%Y%m%dT%H%MZ}"


def campaign_recurrence_activate(*, campaign: Campaign) -> Campaign:
    """Make a draft campaign recurring: its next cron occurrences each send a copy of it."""
    from campaigns.recurrence import recurrence_error

    problem = recurrence_error(campaign.recurrence)
    if problem:
        raise CampaignError(problem)
    campaign_validate(campaign=campaign)
    if not Campaign.objects.filter(pk=campaign.pk, status=Status.DRAFT).update(
        status=Status.RECURRING, recurrence_until=timezone.now()
    ):
        campaign.refresh_from_db()
        raise CampaignError(
            _("campaign %(id)s is %(status)s; only a draft becomes recurring")
            % {"id": campaign.pk, "status": campaign.get_status_display()}
        )
    campaign.refresh_from_db()
    return campaign


def campaign_recurrence_stop(*, campaign: Campaign) -> None:
    """No further occurrences (the ones already sending go on); back to draft."""
    if not Campaign.objects.filter(pk=campaign.pk, status=Status.RECURRING).update(status=Status.DRAFT):
        campaign.refresh_from_db()
        raise CampaignError(
            _("campaign %(id)s is %(status)s, not recurring")
            % {"id": campaign.pk, "status": campaign.get_status_display()}
        )
    campaign.refresh_from_db()


def recurring_dispatch(*, now: datetime | None = None) -> int:
    """Every 5 minutes: record and enqueue each recurring campaign's due occurrence, exactly once.

    Under a distributed lock (SET NX EX 300), so two schedulers never dispatch together; and each
    occurrence is a JobRun with a deterministic key written in the same transaction that moves the
    campaign's watermark, so even without the lock an occurrence is recorded once. Occurrences
    missed while everything was down collapse into the latest one, which is sent once — or
    skipped, by the campaign's misfire policy. Returns how many occurrences were dispatched."""
    from crm import locks

    now = now or timezone.now()
    dispatched = 0
    with locks.locked("campaigns:recurring-dispatch", ttl=RECURRING_LOCK_TTL) as got:
        if not got:
            logger.info("recurring dispatch: another scheduler holds the lock")
            return 0
        for campaign in Campaign.objects.filter(status=Status.RECURRING).select_related("organization"):
            since = campaign.recurrence_until or campaign.created_at
            due = _occurrences(campaign, after=since, until=now)
            if not due:
                continue
            latest = due[-1]
            skip = campaign.recurrence_misfire == Campaign.Misfire.SKIP and now - latest > MISFIRE_GRACE
            with transaction.atomic():
                # Compare-and-set on the watermark: a concurrent pass (lock expired) moves it once.
                if not Campaign.objects.filter(
                    pk=campaign.pk, status=Status.RECURRING, recurrence_until=campaign.recurrence_until
                ).update(recurrence_until=latest):
                    continue
                if skip:
                    logger.warning(
                        "recurring campaign %s: occurrence %s missed while down; skipped by its policy",
                        campaign.pk,
                        latest.isoformat(),
                        extra={"campaign_id": campaign.pk, "organization_id": campaign.organization_id},
                    )
                    continue
                jobrun_enqueue(
                    kind="campaign-occurrence",
                    key=occurrence_key(campaign.pk, latest),
                    func="campaigns.tasks.campaign_occurrence",
                    queue=queues.CAMPAIGN_TRIGGER,
                    kwargs={"campaign_id": campaign.pk, "occurrence": latest.isoformat()},
                    organization_id=campaign.organization_id,
                )
                dispatched += 1
                if len(due) > 1:
                    logger.warning(
                        "recurring campaign %s: %s occurrences missed; sending the latest (%s) once",
                        campaign.pk,
                        len(due) - 1,
                        latest.isoformat(),
                        extra={"campaign_id": campaign.pk, "organization_id": campaign.organization_id},
                    )
    return dispatched


def campaign_occurrence(*, campaign_id: int, occurrence: datetime) -> Campaign | None:
    """Create the occurrence's campaign (a copy of the recurring one) and start it; idempotent:
    the occurrence is unique per recurring campaign, and an existing one is started only once."""
    template = Campaign.objects.filter(pk=campaign_id).first()
    if template is None:
        return None
    label = timezone.localtime(occurrence).strftime("%Y-%m-%d %H:%M")
    with transaction.atomic():
        child, _ = Campaign.objects.get_or_create(
            parent_id=template.pk,
            occurrence_at=occurrence,
            defaults={
                **{name: getattr(template, name) for name in _COPIED_FIELDS},
                "name": f"{template.name} — {label}"[:200],
            },
        )
        if child.status != Status.DRAFT:
            return child  # started before (a re-run of the job)
        return campaign_start_or_stop(campaign=child)
