"""Campaigns: Campaign and its WhatsApp and email messages, audiences and segments, scheduling and
recurring campaigns, contact caps, attribution and lift, signed links and their public endpoints,
the Meta and ESP webhooks' effects, the send jobs and dashboards.

Only `project` may import it (the apps contract keeps the other domain apps independent of it);
it sends through `messaging` and plugs into the platform from `apps.py:ready()`.
"""
