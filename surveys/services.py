"""Every write on post-sale surveys: scheduling, dispatch, sending and answers.

The database is the source of truth: a survey is a row before it is a job, every job has the
deterministic id `survey-<id>`, and the dispatch cron (every minute) enqueues the send of every due
survey whose job Redis does not hold, so a Redis flush loses nothing. Sending is exactly once: a
survey is claimed (SCHEDULED -> SENDING) before the provider is called and goes back to SCHEDULED
only when nothing was handed over; one stuck in SENDING is settled as failed, never resent."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import F, Q, QuerySet, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from crm import hooks, jobs, queues, recovery
from crm.models import Sale
from surveys.models import COMMENT_MAX, OUTCOME_UNKNOWN, SCORE_MAX, SCORE_MIN, Survey

logger = logging.getLogger(__name__)

Status = Survey.Status
Channel = Survey.Channel

SEND_FUNC = "surveys.tasks.survey_send"
ATTEMPTS = queues.get_spec(queues.POST_SALE_SURVEY).attempts  # 3, backoff from 60 s
SCHEDULE_CHUNK = 2000
# A sale whose survey would have been due this long ago gets none: an ERP backfill of last
# year's sales must not survey every customer about a purchase they have forgotten.
STALE_AFTER = timedelta(days=7)
# Longer than the queue's job timeout (120 s): a survey claimed this long ago lost its worker.
STUCK_AFTER = timedelta(minutes=15)
PAUSED_DELAY = 60.0
THROTTLE_DELAY = 5.0
# A send waits for its rate slot inside the job only this long; a longer wait gives the worker back.
MAX_SLOT_WAIT = 20.0
LANGUAGE = "pt-br"
WHATSAPP_LANGUAGE = "pt_BR"
FIRST_NAME_FALLBACK = "cliente"


class SurveyRetry(Exception):
    """A send that may work later (soft bounce, provider hiccup): RQ retries it, spending an attempt."""


def survey_job_id(survey_id: int) -> str:
    return jobs.make_job_id("survey", survey_id)


def _send_spec(survey_id: int, organization_id: int) -> jobs.JobSpec:
    return jobs.JobSpec(
        func=SEND_FUNC,
        queue=queues.POST_SALE_SURVEY,
        kwargs={"survey_id": survey_id},
        job_id=survey_job_id(survey_id),
        organization_id=organization_id,
    )


# --- Scheduling ----------------------------------------------------------------------------------


def surveys_schedule(*, sale_ids: Iterable[int]) -> int:
    """Create the survey of each sale that should have one; returns how many were created.

    Once per sale (a unique sale column, ON CONFLICT DO NOTHING): safe to run twice or concurrently.
    Two queries per 2,000 sales, none per sale. No survey for a sale without a customer, of an
    organization whose surveys are off, or whose survey would be due more than STALE_AFTER ago.
    """
    ids = sorted(set(sale_ids))
    now = timezone.now()
    created = 0
    for start in range(0, len(ids), SCHEDULE_CHUNK):
        rows = (
            Sale.objects.filter(
                pk__in=ids[start : start + SCHEDULE_CHUNK],
                customer__isnull=False,
                organization__survey_channel__in=Channel.values,
                survey__isnull=True,
            )
            .order_by()
            .values_list(
                "pk",
                "organization_id",
                "store_id",
                "customer_id",
                "sold_at",
                "organization__survey_channel",
                "organization__survey_delay_days",
            )
        )
        surveys = []
        for sale_id, organization_id, store_id, customer_id, sold_at, channel, delay_days in rows:
            due_at = sold_at + timedelta(days=delay_days)
            if due_at < now - STALE_AFTER:
                continue
            surveys.append(
                Survey(
                    organization_id=organization_id,
                    sale_id=sale_id,
                    customer_id=customer_id,
                    store_id=store_id,
                    channel=channel,
                    due_at=due_at,
                )
            )
        Survey.objects.bulk_create(surveys, ignore_conflicts=True, batch_size=SCHEDULE_CHUNK)
        created += len(surveys)
    return created


def sales_written(event: hooks.SalesWritten) -> int:
    """The "sales written" hook: each new sale gets its survey scheduled; returns how many."""
    return surveys_schedule(sale_ids=event.created_ids) if event.created_ids else 0


# --- Dispatch ------------------------------------------------------------------------------------


def _due(now: datetime) -> QuerySet[Survey]:
    return (
        Survey.objects.filter(status=Status.SCHEDULED, due_at__lte=now)
        # A paused channel would only have its jobs defer again and again: they wait in the table.
        .exclude(
            Q(channel=Channel.EMAIL, organization__email_paused_at__isnull=False)
            | Q(channel=Channel.WHATSAPP, organization__whatsapp_paused_at__isnull=False)
        )
    )


def surveys_dispatch(*, limit: int = 5000) -> int:
    """Enqueue the send of each due survey (oldest first, at most `limit`) whose job Redis does not
    hold; returns how many were enqueued. Also settles surveys stuck in SENDING.

    Safe to run twice or concurrently: a job id is enqueued only when no live job has it, and a
    second run of a send finds its survey already claimed.
    """
    surveys_settle_stuck()
    due = list(_due(timezone.now()).order_by("due_at").values_list("pk", "organization_id")[:limit])
    return recovery.requeue_missing(_send_spec(pk, organization_id) for pk, organization_id in due)


def send_given_up(kwargs: dict, reason: str, error: BaseException | None) -> None:
    """A survey whose send cannot succeed is FAILED with the reason (never sent later)."""
    Survey.objects.filter(pk=kwargs["survey_id"], status__in=[Status.SCHEDULED, Status.SENDING]).update(
        status=Status.FAILED, reason=reason
    )


def due_surveys() -> Iterator[jobs.JobSpec]:
    """Due surveys whose send job Redis no longer holds (the dispatch cron does the same each minute)."""
    due = _due(timezone.now()).values_list("pk", "organization_id")
    for pk, organization_id in due.iterator(chunk_size=2000):
        yield _send_spec(pk, organization_id)


def surveys_settle_stuck(*, older_than: timedelta = STUCK_AFTER) -> int:
    """Surveys claimed long ago whose worker died: FAILED as "outcome unknown", never resent."""
    settled = Survey.objects.filter(status=Status.SENDING, sending_at__lt=timezone.now() - older_than).update(
        status=Status.FAILED, reason=OUTCOME_UNKNOWN
    )
    if settled:
        logger.warning("%s surveys stuck in sending settled as failed (outcome unknown)", settled)
    return settled


def surveys_send_now(*, survey_ids: Iterable[int]) -> int:
    """Make the given scheduled surveys due now and enqueue their sends; returns how many."""
    rows = list(
        Survey.objects.filter(pk__in=list(survey_ids), status=Status.SCHEDULED).values_list(
            "pk", "organization_id"
        )
    )
    if not rows:
        return 0
    ids = [pk for pk, _organization_id in rows]
    Survey.objects.filter(pk__in=ids, status=Status.SCHEDULED).update(due_at=timezone.now())
    recovery.requeue_missing(_send_spec(pk, organization_id) for pk, organization_id in rows)
    return len(ids)


def surveys_cancel(*, survey_ids: Iterable[int]) -> int:
    """Cancel scheduled surveys (a queued send of one then does nothing); returns how many."""
    return Survey.objects.filter(pk__in=list(survey_ids), status=Status.SCHEDULED).update(
        status=Status.CANCELLED, reason="cancelled by an operator"
    )


# --- Answers -------------------------------------------------------------------------------------


def survey_answer(*, survey: Survey, score: int, comment: str) -> bool:
    """Record the answer; True only for the first one (a compare-and-set on answered_at), so a sale's
    survey is answered once even with two submissions at the same moment."""
    if not SCORE_MIN <= score <= SCORE_MAX:
        raise ValueError(f"score {score} is not between {SCORE_MIN} and {SCORE_MAX}")
    now = timezone.now()
    with transaction.atomic():
        answered = Survey.objects.filter(pk=survey.pk, answered_at__isnull=True).update(
            status=Status.ANSWERED,
            answered_at=now,
            score=score,
            comment=comment.strip()[:COMMENT_MAX],
            # Answered before its send was recorded (a very quick tap): it still counts as surveyed.
            sent_at=Coalesce(F("sent_at"), Value(now)),
        )
        if answered and survey.customer_id:
            # Once, with the answer: flows' `survey_answered` trigger (detractors) and exit_on.
            hooks.customer_events(
                [
                    hooks.CustomerEvent(
                        "survey_answered",
                        survey.organization_id,
                        survey.customer_id,
                        now,
                        f"survey:{survey.pk}",
                        {"survey_id": survey.pk, "score": score},
                    )
                ]
            )
    return bool(answered)
