from crm import queues
from crm.cron import CronEntry

ENTRIES = [
    CronEntry(
        name="whatsapp-reconcile",
        cron="*/15 * * * *",
        func="campaigns.tasks.whatsapp_reconcile",
        queue=queues.MAINTENANCE,
        description="Settle WhatsApp messages stuck in flight",
    ),
]
