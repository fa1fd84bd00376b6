"""Campaigns' admin, one module per page family. Django's autodiscovery imports this package: each
module below registers its ModelAdmins (@admin.register) as it is imported."""

from campaigns.admin import campaign, segments, sent_messages  # noqa: F401
