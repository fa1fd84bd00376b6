"""Campaigns: Campaign and its WhatsApp and email messages, audiences and segments, scheduling and
recurring campaigns, contact caps, attribution and lift, signed links and their public endpoints,
the Meta and ESP webhooks' effects, the send jobs and dashboards.

Rooms by concern: `models/` and `admin/` packages; `lifecycle` (validate, start, schedule, pause,
resume, cancel, retry, archive, complete), `fanout`, `recurring`, `recovery` (its recoverers and
give-ups); `whatsapp/` and `email/` (the send jobs, each in named steps); `tasks` holds the job
functions RQ and cron name by path.

Only the layers above it, `flows` and `project`, may import it (the apps contract keeps the other
domain apps independent of it); it sends through `messaging` and plugs into the platform from
`apps.py:ready()`.
"""
