"""Reads of post-sale surveys: the NPS report."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime
from zoneinfo import ZoneInfo

from django.db.models import Count, F, FloatField, Q
from django.db.models.functions import Cast, TruncMonth

from crm.models import Organization
from surveys.models import Survey

PROMOTER_MIN = 9  # 9-10
DETRACTOR_MAX = 6  # 0-6


@dataclass(frozen=True)
class NpsRow:
    month: date
    store_id: int | None  # None: every store of the month
    store_name: str
    responses: int
    promoters: int
    passives: int
    detractors: int
    nps: float  # %promoters - %detractors, from -100 to 100

    @classmethod
    def of(
        cls,
        *,
        month: date,
        store_id: int | None,
        store_name: str,
        responses: int,
        promoters: int,
        detractors: int,
    ) -> NpsRow:
        return cls(
            month=month,
            store_id=store_id,
            store_name=store_name,
            responses=responses,
            promoters=promoters,
            passives=responses - promoters - detractors,
            detractors=detractors,
            nps=round(100.0 * (promoters - detractors) / responses, 1) if responses else 0.0,
        )


def nps_by_store_and_month(
    *, organization: Organization, since: datetime | None = None, until: datetime | None = None
) -> list[NpsRow]:
    """NPS per store and per month of the answer (in the organization's time zone), newest month first.

    One GROUP BY query: the database counts responses, promoters (9-10) and detractors (0-6) and
    computes the NPS; nothing loops over individual answers.
    """
    answers = Survey.objects.filter(
        organization_id=organization.pk, answered_at__isnull=False, score__isnull=False
    )
    if since is not None:
        answers = answers.filter(answered_at__gte=since)
    if until is not None:
        answers = answers.filter(answered_at__lt=until)
    rows = (
        answers.annotate(month=TruncMonth("answered_at", tzinfo=ZoneInfo(organization.timezone)))
        .values("month", "store_id", "store__name")
        .annotate(
            responses=Count("id"),
            promoters=Count("id", filter=Q(score__gte=PROMOTER_MIN)),
            detractors=Count("id", filter=Q(score__lte=DETRACTOR_MAX)),
        )
        .annotate(
            nps=Cast(F("promoters") - F("detractors"), FloatField())
            * 100.0
            / Cast(F("responses"), FloatField())
        )
        .order_by("-month", "store__name", "store_id")
    )
    return [
        NpsRow(
            month=row["month"].date() if isinstance(row["month"], datetime) else row["month"],
            store_id=row["store_id"],
            store_name=row["store__name"],
            responses=row["responses"],
            promoters=row["promoters"],
            passives=row["responses"] - row["promoters"] - row["detractors"],
            detractors=row["detractors"],
            nps=round(row["nps"], 1),
        )
        for row in rows
    ]


def nps_month_totals(rows: list[NpsRow]) -> dict[date, NpsRow]:
    """Every store of each month together, from the per-store counts (never an average of NPSs)."""
    totals: dict[date, list[int]] = {}
    for row in rows:
        counts = totals.setdefault(row.month, [0, 0, 0])
        counts[0] += row.responses
        counts[1] += row.promoters
        counts[2] += row.detractors
    return {
        month: NpsRow.of(month=month, store_id=None, store_name="", responses=r, promoters=p, detractors=d)
        for month, (r, p, d) in totals.items()
    }
