"""The schedule trigger of the integration runner: its periodic jobs (see crm.cron) and the dispatch
that starts each scheduled handler's runs."""

from __future__ import annotations

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from croniter import croniter
from django.db import transaction
from django.utils import timezone

from crm import queues
from crm.cron import CronEntry
from crm.models import JobRun, Organization
from runner.executions import execution_start
from runner.models import Handler

ENTRIES = [
    CronEntry(
        name="runner-dispatch",
        cron="* * * * *",
        func="runner.tasks.schedules_dispatch",
        queue=queues.MAINTENANCE,
        description="Start the integration runs whose handler schedule is due (organization time zone)",
    ),
    CronEntry(
        name="runner-event-ids-prune",
        cron="*/10 * * * *",
        func="runner.tasks.webhook_events_prune",
        queue=queues.MAINTENANCE,
        description="Forget the webhook and AMQP event ids older than 7 days",
    ),
]


def schedules_dispatch(*, now: datetime | None = None, lookback: timedelta = timedelta(minutes=2)) -> int:
    """Start one execution per due cron occurrence of each scheduled handler, in each organization's
    time zone, exactly once per occurrence (a JobRun per occurrence). Returns how many were started."""
    now = now or timezone.now()
    started = 0
    handlers = (
        Handler.objects.select_related("integration")
        .exclude(schedule_cron="")
        .filter(integration__enabled=True)
    )
    for handler in handlers:
        if not croniter.is_valid(handler.schedule_cron):
            continue
        orgs = (
            Organization.objects.all()
            if handler.organization_id is None
            else Organization.objects.filter(pk=handler.organization_id)
        )
        for org in orgs.only("id", "timezone"):
            tz = ZoneInfo(org.timezone or "America/Sao_Paulo")
            it = croniter(handler.schedule_cron, (now - lookback).astimezone(tz))
            while (when := it.get_next(datetime)) <= now:
                key = f"{handler.pk}:{org.pk}:{when.astimezone(tz).isoformat()}"
                with transaction.atomic():
                    _run, created = JobRun.objects.get_or_create(
                        kind="runner-schedule",
                        key=key,
                        defaults={
                            "organization_id": org.pk,
                            "status": JobRun.Status.COMPLETED,
                            "finished_at": now,
                        },
                    )
                    if created:
                        execution_start(handler=handler, organization_id=org.pk, trigger="schedule")
                        started += 1
    return started
