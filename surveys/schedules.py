"""Periodic jobs of post-sale surveys (see crm.cron)."""

from crm import queues
from crm.cron import CronEntry

ENTRIES = [
    CronEntry(
        name="surveys-dispatch",
        cron="* * * * *",
        func="surveys.tasks.surveys_dispatch",
        queue=queues.MAINTENANCE,
        description="Enqueue the sends of due post-sale surveys",
    ),
]
