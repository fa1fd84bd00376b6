from crm import queues
from crm.cron import CronEntry

ENTRIES = [
    CronEntry(
        name="flows-tick",
        cron="* * * * *",
        func="flows.tasks.flows_tick",
        queue=queues.FLOWS,
        description="Flows: today's date and no-purchase entries, and the steps that came due",
    ),
]
