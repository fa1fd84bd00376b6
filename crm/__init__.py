"""The platform below every app: settings and wsgi; Organization (the tenant), memberships and roles,
Store, Customer, Sale; queues, priorities and fair share, the one enqueue path (`crm.jobs`), the
worker, JobRun checkpoints, locks, recovery, resilience (breaker, windows, leases), rate limits, the
inbox, cron, tenancy, crypto, /metrics and the queue pages.

Every app may import it. It imports no domain app: apps plug in from their `AppConfig.ready` through
the registries here (`hooks.on_sales_written`, `recovery.register`/`gives_up`, `inbox_kinds.register`,
`prometheus.register_collector`, `admin.register_organization_page`).
"""
