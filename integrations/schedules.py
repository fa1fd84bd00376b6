from crm import queues
from crm.cron import CronEntry

ENTRIES = [
    CronEntry(
        name="whatsapp-pricing-sync",
        cron="0 4 * * 1",
        func="integrations.tasks.whatsapp_prices_sync",
        queue=queues.MAINTENANCE,
        description="Refresh WhatsApp prices (Mondays 04:00)",
    ),
    CronEntry(
        name="whatsapp-templates-sync",
        cron="30 5 * * *",
        func="integrations.tasks.whatsapp_templates_sync",
        queue=queues.MAINTENANCE,
        description="Refresh every WhatsApp Business account's message templates (daily 05:30)",
    ),
]
