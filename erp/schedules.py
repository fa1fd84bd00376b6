"""The ERP syncs' cron entries (read in settings.TIME_ZONE, America/Sao_Paulo by default).

Each entry fires a fan-out job that enqueues the real work per organization and store:

- ``erp-sales-nightly`` 06:00: every store's sales of yesterday (00:00-24:00 in the
  organization's zone), job id ``erp-sales-<org id>-<store id>-<YYYYMMDD>`` (the day synced).
- ``erp-sales-hourly`` every hour at :00: every store's sales of the last whole hour, job id
  ``erp-sales-<org id>-<store id>-<YYYYMMDDHH>`` (the hour synced, its start).
- ``erp-customers-daily`` 05:00: every organization's full customer sync, job id
  ``erp-customers-<org id>-<YYYYMMDD>``.

Store i of an organization starts i * 2 min + a random 0-30 s after its fan-out. Ids are enqueued
with unique=True: while a job with that id exists — queued, delayed, running, or finished within
the queues' result_ttl of 25 h, after which RQ cleans it — the same id is refused, so a second
firing (or fan-out retry) in that window enqueues nothing. Each id is also the key of a JobRun
written before the job, so a completed window is never synced twice by the cron and one lost
with Redis is re-enqueued by `recover`.
"""

from crm import queues
from crm.cron import CronEntry

ENTRIES = [
    CronEntry(
        name="erp-sales-nightly",
        cron="0 6 * * *",
        func="erp.tasks.erp_sales_fanout",
        queue=queues.ERP_SYNC,
        description="ERP sales of yesterday, every store (staggered)",
        kwargs={"frequency": "nightly"},
    ),
    CronEntry(
        name="erp-sales-hourly",
        cron="0 * * * *",
        func="erp.tasks.erp_sales_fanout",
        queue=queues.ERP_SYNC,
        description="ERP sales of the last hour, every store (staggered)",
        kwargs={"frequency": "hourly"},
    ),
    CronEntry(
        name="erp-customers-daily",
        cron="0 5 * * *",
        func="erp.tasks.erp_customers_fanout",
        queue=queues.ERP_CUSTOMER_SYNC,
        description="Full ERP customer sync of every organization",
    ),
]
