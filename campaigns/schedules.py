from crm import queues
from crm.cron import CronEntry

ENTRIES = [
    CronEntry(
        name="whatsapp-reconcile",
        cron="*/15 * * * *",
        func="campaigns.tasks.whatsapp_reconcile",
        queue=queues.MAINTENANCE,
        description="Settle campaign messages (WhatsApp and email) stuck in flight",
    ),
    CronEntry(
        name="campaigns-recurring",
        cron="*/5 * * * *",
        func="campaigns.tasks.recurring_dispatch",
        queue=queues.CAMPAIGN_TRIGGER,
        description="Dispatch each recurring campaign's due occurrence once (under a lock)",
    ),
    CronEntry(
        name="segments-snapshot",
        cron="0 3 * * *",
        func="campaigns.tasks.segments_snapshot_all",
        # Long set-based SQL over the ERP's sales: the sync queue's hour-long timeout and retries,
        # after every send queue in worker order, and on the dedicated ERP pool when there is one.
        queue=queues.ERP_SYNC,
        description="Daily RFM segment snapshot of every organization with sales",
    ),
]
