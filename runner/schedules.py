"""Periodic jobs of the integration runner (see crm.cron)."""

from crm import queues
from crm.cron import CronEntry

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
