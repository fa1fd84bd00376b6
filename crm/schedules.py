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
    CronEntry(
        name="inbox-set-aside-prune",
        cron="40 3 * * *",
        func="crm.tasks.inbox_set_aside_prune",
        queue=queues.MAINTENANCE,
        description="Delete the inbox events set aside more than 30 days ago",
    ),
]
