"""Post-sale surveys: a survey scheduled for each sale (the platform's "sales written" hook), sent by
WhatsApp or email through `messaging`, the public answer page, NPS.

Only `project` may import it (`surveys.selectors` for pages that combine apps); it plugs into the
platform from `apps.py:ready()`.
"""
