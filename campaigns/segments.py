"""Daily RFM segments of each organization's customers, computed from the sales in SQL.

A snapshot of day D describes, as of the end of D in the organization's time zone, every customer
with at least one sale sold by then (customers who never bought are not segmented):

- recency_days: D minus the local date of the customer's last sale (0 = bought on D);
- frequency: the number of sales in the 365 days ending with D;
- monetary: the sum of those sales' totals.

Scores from 1 to 5 (5 = best) are given among the organization's *active* customers (frequency > 0):
R by recency (fewer days is better), F by frequency, M by monetary, each NTILE(5) over those
customers ordered worst to best. Customers tied on a value get the lowest tile of the tie: NTILE
alone splits a tie across tiles, so two customers who bought alike could land in different
segments, and a re-run could move them.

The segment is the first rule that matches (FM = F + M, from 2 to 10):

    lost            no sale in the 365 days ending with D (only earlier ones)
    new             first sale ever within the 30 days ending with D
    champions       R >= 4 and FM >= 7
    loyal           R >= 3 and FM >= 5
    promising       R >= 4                  (recent, still little bought)
    need_attention  R = 3                   (FM <= 4)
    at_risk         FM >= 5                 (R <= 2: bought often or much, not lately)
    about_to_sleep  R = 2                   (FM <= 4)
    hibernating     the rest                (R = 1 and FM <= 4)

A snapshot is one transaction per organization: delete that day's rows, one INSERT … SELECT
(aggregate per customer, window functions over the result), then the movement from the previous
snapshot by one FULL JOIN … GROUP BY. Nothing is loaded into Python, so memory does not grow with
the number of customers, and neither does the number of queries.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from django.conf import settings
from django.db import connection, models, transaction
from django.db.models import Exists, Max, OuterRef, Sum
from django.utils import timezone
from django.utils.functional import Promise
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from campaigns.models import CustomerSegment, Segment, SegmentMovement
from crm import bulk, hooks
from crm.cli import number
from crm.models import Organization, Sale

ACTIVE_DAYS = 365
NEW_CUSTOMER_DAYS = 30


@dataclass(frozen=True)
class Rule:
    segment: Segment
    sql: str  # over the columns of the `scores` step: recency_days, frequency, first_at, r, f, m
    description: Promise


# In order: the first match wins. The SQL CASE is built from this list, so it is the one definition.
RULES: tuple[Rule, ...] = (
    Rule(Segment.LOST, "frequency = 0", _("no sale in the last 365 days, only earlier ones")),
    Rule(Segment.NEW, "first_at >= %(new_start)s", _("first sale ever within the last 30 days")),
    Rule(Segment.CHAMPIONS, "r >= 4 AND f + m >= 7", _("R ≥ 4 and F + M ≥ 7")),
    Rule(Segment.LOYAL, "r >= 3 AND f + m >= 5", _("R ≥ 3 and F + M ≥ 5")),
    Rule(Segment.PROMISING, "r >= 4", _("R ≥ 4, F + M ≤ 6")),
    Rule(Segment.NEED_ATTENTION, "r = 3", _("R = 3, F + M ≤ 4")),
    Rule(Segment.AT_RISK, "f + m >= 5", _("R ≤ 2 and F + M ≥ 5")),
    Rule(Segment.ABOUT_TO_SLEEP, "r = 2", _("R = 2, F + M ≤ 4")),
    Rule(Segment.HIBERNATING, "1 = 1", _("R = 1, F + M ≤ 4")),
)
assert {r.segment for r in RULES} == set(Segment), "every segment needs a rule"

# Days from the last sale's local date to the snapshot's day.
_DAYS_SINCE_LAST_SALE = "%(day)s::date - (MAX(s.sold_at) AT TIME ZONE %(tz)s)::date"

_SNAPSHOT_SQL = """
WITH per_customer AS (
    SELECT s.customer_id AS customer_id,
           {days_since_last_sale} AS recency_days,
           MIN(s.sold_at) AS first_at,
           SUM(CASE WHEN s.sold_at >= %(year_start)s THEN 1 ELSE 0 END) AS frequency,
           SUM(CASE WHEN s.sold_at >= %(year_start)s THEN s.total ELSE 0 END) AS monetary
    FROM {sale} s
    WHERE s.organization_id = %(org)s AND s.customer_id IS NOT NULL AND s.sold_at < %(cutoff)s
    GROUP BY s.customer_id
),
tiles AS (
    SELECT p.customer_id, p.recency_days, p.first_at, p.frequency, p.monetary,
           NTILE(5) OVER (PARTITION BY p.frequency > 0 ORDER BY p.recency_days DESC) AS r_tile,
           NTILE(5) OVER (PARTITION BY p.frequency > 0 ORDER BY p.frequency) AS f_tile,
           NTILE(5) OVER (PARTITION BY p.frequency > 0 ORDER BY p.monetary) AS m_tile
    FROM per_customer p
),
scores AS (
    SELECT t.customer_id, t.recency_days, t.first_at, t.frequency, t.monetary,
           MIN(t.r_tile) OVER (PARTITION BY t.frequency > 0, t.recency_days) AS r,
           MIN(t.f_tile) OVER (PARTITION BY t.frequency > 0, t.frequency) AS f,
           MIN(t.m_tile) OVER (PARTITION BY t.frequency > 0, t.monetary) AS m
    FROM tiles t
)
INSERT INTO {segment} (
    organization_id, day, customer_id, segment, recency_days, frequency, monetary, r_score, f_score, m_score
)
SELECT %(org)s, %(day)s, customer_id, CASE {rules} END, recency_days, frequency, monetary,
       CASE WHEN frequency > 0 THEN r END, CASE WHEN frequency > 0 THEN f END,
       CASE WHEN frequency > 0 THEN m END
FROM scores
"""

_MOVEMENT_SQL = """
INSERT INTO {movement} (organization_id, day, previous_day, from_segment, to_segment, customers)
SELECT %(org)s, %(day)s, %(previous)s, COALESCE(p.segment, ''), COALESCE(c.segment, ''), COUNT(*)
FROM (SELECT customer_id, segment FROM {segment} WHERE organization_id = %(org)s AND day = %(day)s) c
FULL OUTER JOIN (
    SELECT customer_id, segment FROM {segment} WHERE organization_id = %(org)s AND day = %(previous)s
) p ON p.customer_id = c.customer_id
GROUP BY COALESCE(p.segment, ''), COALESCE(c.segment, '')
"""

_DELETE_DAY_SQL = "DELETE FROM {table} WHERE organization_id = %(org)s AND day = %(day)s"
_DELETE_BEFORE_SQL = "DELETE FROM {table} WHERE organization_id = %(org)s AND day < %(before)s"

# The first snapshot of an organization: everyone is new to the snapshot.
_FIRST_MOVEMENT_SQL = """
INSERT INTO {movement} (organization_id, day, from_segment, to_segment, customers)
SELECT %(org)s, %(day)s, '', segment, COUNT(*)
FROM {segment} WHERE organization_id = %(org)s AND day = %(day)s
GROUP BY segment
"""


def _tables() -> dict[str, str]:

    qn = connection.ops.quote_name
    return {
        "sale": qn(Sale._meta.db_table),
        "segment": qn(CustomerSegment._meta.db_table),
        "movement": qn(SegmentMovement._meta.db_table),
    }


def _snapshot_sql() -> str:
    rules = " ".join(f"WHEN {rule.sql} THEN '{rule.segment.value}'" for rule in RULES)
    return _SNAPSHOT_SQL.format(days_since_last_sale=_DAYS_SINCE_LAST_SALE, rules=rules, **_tables())


def _local_midnight(day: date, zone: ZoneInfo) -> Any:
    """The start of `day` in `zone`, as the database adapter wants an aware datetime."""
    return connection.ops.adapt_datetimefield_value(datetime.combine(day, time.min, tzinfo=zone))


EARLIEST_DAY = date(1970, 1, 1)


def snapshot_day(text: str) -> date:
    """A snapshot day from YYYY-MM-DD, between EARLIEST_DAY and tomorrow (in any time zone, today
    somewhere); raises ValueError with the reason otherwise (a day whose windows reach past year 1,
    or the far future, would fail the computation)."""
    try:
        day = date.fromisoformat(text)
    except ValueError:
        raise ValueError(gettext("%(text)r is not a date YYYY-MM-DD") % {"text": text[:40]}) from None
    latest = timezone.now().date() + timedelta(days=1)
    if not EARLIEST_DAY <= day <= latest:
        raise ValueError(
            gettext("%(day)s is out of range: a snapshot day is from %(first)s to %(last)s")
            % {"day": day.isoformat(), "first": EARLIEST_DAY.isoformat(), "last": latest.isoformat()}
        )
    return day


def default_day(tz: str) -> date:
    """The last complete day in the time zone `tz`: yesterday there."""
    return timezone.now().astimezone(ZoneInfo(tz)).date() - timedelta(days=1)


def organizations_with_sales() -> models.QuerySet:
    """Organizations that have at least one sale (the ones a snapshot can segment), by slug."""
    return Organization.objects.filter(Exists(Sale.objects.filter(organization_id=OuterRef("pk")))).order_by(
        "slug"
    )


def segments_snapshot(*, organization_id: int, day: date) -> dict[str, int]:
    """Replace the organization's snapshot of `day` and its movement; returns customers per segment.

    Safe to run again: the day's rows are deleted and rebuilt in one transaction, and the next
    snapshot's movement (when `day` is a backfill) is recomputed against the new rows.
    """
    zone = ZoneInfo(Organization.objects.values_list("timezone", flat=True).get(pk=organization_id))
    params = {
        "org": organization_id,
        "day": connection.ops.adapt_datefield_value(day),
        "tz": zone.key,
        "cutoff": _local_midnight(day + timedelta(days=1), zone),
        "year_start": _local_midnight(day - timedelta(days=ACTIVE_DAYS - 1), zone),
        "new_start": _local_midnight(day - timedelta(days=NEW_CUSTOMER_DAYS - 1), zone),
    }
    tables = _tables()
    with transaction.atomic(), connection.cursor() as cursor:
        # One snapshot per organization at a time (the cron job and the command may overlap).
        cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [f"segments:{organization_id}"])
        # Sorts and the per-customer aggregate stay in memory up to this, then spill to disk.
        cursor.execute("SET LOCAL work_mem = '64MB'")
        cursor.execute(_DELETE_DAY_SQL.format(table=tables["segment"]), params)
        cursor.execute(_snapshot_sql(), params)
        inserted = cursor.rowcount
        _movement_store(cursor, organization_id=organization_id, day=day)
        later = (
            CustomerSegment.objects.filter(organization_id=organization_id, day__gt=day)
            .order_by("day")
            .values_list("day", flat=True)
            .first()
        )
        if later is not None:
            _movement_store(cursor, organization_id=organization_id, day=later)
        else:  # the newest snapshot: who entered a segment since the one before acts now (flows)
            _entered_announce(organization_id=organization_id, day=day)
    bulk.analyze_if_grown(CustomerSegment, inserted)  # today's audience queries, on today's numbers
    return segment_counts(organization_id=organization_id, day=day)


def _movement_store(cursor: Any, *, organization_id: int, day: date) -> None:
    """(Re)compute how the customers of the snapshot `day` moved from the snapshot before it."""
    tables = _tables()
    previous = (
        CustomerSegment.objects.filter(organization_id=organization_id, day__lt=day)
        .aggregate(d=Max("day"))
        .get("d")
    )
    params = {
        "org": organization_id,
        "day": connection.ops.adapt_datefield_value(day),
        "previous": connection.ops.adapt_datefield_value(previous),
    }
    cursor.execute(_DELETE_DAY_SQL.format(table=tables["movement"]), params)
    cursor.execute((_FIRST_MOVEMENT_SQL if previous is None else _MOVEMENT_SQL).format(**tables), params)


# The customers of the snapshot `day` whose segment is not the one they had in the snapshot before,
# after `after` (keyset pages over the (organization, day, customer) key).
_ENTERED_SQL = """
SELECT c.customer_id, c.segment FROM {segment} c
LEFT JOIN {segment} p
  ON p.organization_id = c.organization_id AND p.day = %(previous)s AND p.customer_id = c.customer_id
WHERE c.organization_id = %(org)s AND c.day = %(day)s AND c.customer_id > %(after)s
  AND p.segment IS DISTINCT FROM c.segment
ORDER BY c.customer_id LIMIT %(page)s
"""
ENTERED_PAGE = 5_000


def _entered_announce(*, organization_id: int, day: date) -> int:
    """Tell the customer-events consumers (flows' `segment_entered`) who entered a segment in the
    snapshot `day`, a page at a time inside the snapshot's transaction; returns how many. The first
    snapshot of an organization announces nobody (nobody moved: everyone is new to the snapshots). The
    event's key names the day and the segment, so a snapshot taken again enrolls nobody twice."""
    previous = (
        CustomerSegment.objects.filter(organization_id=organization_id, day__lt=day)
        .aggregate(d=Max("day"))
        .get("d")
    )
    if previous is None:
        return 0
    params: dict[str, Any] = {
        "org": organization_id,
        "day": connection.ops.adapt_datefield_value(day),
        "previous": connection.ops.adapt_datefield_value(previous),
        "after": 0,
        "page": ENTERED_PAGE,
    }
    sql, at, announced = _ENTERED_SQL.format(**_tables()), timezone.now(), 0
    while True:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall()
        if not rows:
            return announced
        hooks.customer_events(
            [
                hooks.CustomerEvent(
                    "segment_entered",
                    organization_id,
                    customer_id,
                    at,
                    key=f"{day}:{segment}",
                    data={"segment": segment},
                )
                for customer_id, segment in rows
            ]
        )
        announced += len(rows)
        params["after"] = rows[-1][0]


def segments_prune(*, organization_id: int, keep_days: int | None = None) -> int:
    """Delete the organization's snapshots older than the last `keep_days` days (SEGMENT_KEEP_DAYS)
    before its newest one; returns how many customer rows went."""
    keep = settings.SEGMENT_KEEP_DAYS if keep_days is None else keep_days
    newest = SegmentMovement.objects.filter(organization_id=organization_id).aggregate(d=Max("day"))["d"]
    if newest is None:
        return 0
    params = {
        "org": organization_id,
        "before": connection.ops.adapt_datefield_value(newest - timedelta(days=max(keep, 1) - 1)),
    }
    tables = _tables()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_DELETE_BEFORE_SQL.format(table=tables["segment"]), params)
        removed = cursor.rowcount
        cursor.execute(_DELETE_BEFORE_SQL.format(table=tables["movement"]), params)
    return removed


# --- Reads: all from the small movement table, never a COUNT over a day's million rows. ---------


def segment_counts(*, organization_id: int, day: date) -> dict[str, int]:
    """Customers per segment in the snapshot of `day` (every segment, zeros included)."""
    rows = (
        SegmentMovement.objects.filter(organization_id=organization_id, day=day)
        .exclude(to_segment="")
        .values_list("to_segment")
        .annotate(n=Sum("customers"))
        .order_by()
    )
    counts = dict.fromkeys(Segment.values, 0)
    counts.update(dict(rows))
    return counts


def segment_days(
    *, organization_id: int | None = None, organization_ids: Collection[int] | None = None
) -> list[date]:
    """Days with a snapshot (of one organization, of those in `organization_ids`, or of any when
    both are None), newest first."""
    qs = SegmentMovement.objects.all()
    if organization_id is not None:
        qs = qs.filter(organization_id=organization_id)
    if organization_ids is not None:
        qs = qs.filter(organization_id__in=organization_ids)
    return list(qs.order_by("-day").values_list("day", flat=True).distinct())


@dataclass(frozen=True)
class Movement:
    previous_day: date | None
    counts: dict[str, int]  # this snapshot, per segment
    previous_counts: dict[str, int]  # the previous snapshot, per segment
    matrix: dict[tuple[str, str], int]  # (from, to) -> customers; "" = not in that snapshot


def segment_movement(*, organization_id: int, day: date) -> Movement:
    """The snapshot of `day` against the one before it, from the stored movement (one query)."""
    rows = list(
        SegmentMovement.objects.filter(organization_id=organization_id, day=day).values_list(
            "previous_day", "from_segment", "to_segment", "customers"
        )
    )
    counts = dict.fromkeys(Segment.values, 0)
    previous_counts = dict.fromkeys(Segment.values, 0)
    matrix: dict[tuple[str, str], int] = {}
    for _previous, source, target, n in rows:
        matrix[(source, target)] = n
        if target:
            counts[target] += n
        if source:
            previous_counts[source] += n
    return Movement(
        previous_day=rows[0][0] if rows else None,
        counts=counts,
        previous_counts=previous_counts,
        matrix=matrix,
    )


def snapshot_summary(slug: str, day: date, counts: dict[str, int], seconds: float) -> str:
    """`demo 2026-11-29: 12,345 customers in 7 segments (champions 1,234, …) in 0.8s`, in the
    active language (pt-br: `12.345 clientes em 7 segmentos (campeões 1.234, …) em 0,8s`)."""
    present = [(segment, n) for segment, n in counts.items() if n]
    detail = ", ".join(f"{Segment(segment).label} {number(n)}" for segment, n in present)
    line = gettext("%(slug)s %(day)s: %(customers)s customers in %(segments)s segments") % {
        "slug": slug,
        "day": day.isoformat(),
        "customers": number(sum(counts.values())),
        "segments": number(len(present)),
    }
    return f"{line}{f' ({detail})' if detail else ''}" + gettext(" in %(seconds)ss") % {
        "seconds": number(seconds, 1)
    }
