"""The platform's own periodic jobs (see crm.cron)."""

from crm import queues
from crm.cron import CronEntry

ENTRIES = [
    CronEntry(
        name="recover",
        cron="* * * * *",
        func="crm.tasks.recover_pass",
        queue=queues.MAINTENANCE,
        description="Re-enqueue unfinished work that Redis no longer holds",
    ),
]
