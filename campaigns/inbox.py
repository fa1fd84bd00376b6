"""Meta's status and preference webhooks, applied from the inbox in batches (crm/inbox.py)."""

from __future__ import annotations

import json

from campaigns import statuses
from crm import inbox
from integrations.whatsapp import webhooks
from integrations.whatsapp.webhooks import PreferenceEvent, StatusEvent

KIND = "whatsapp"


@inbox.register(KIND)
def webhooks_apply(events: list[inbox.Event]) -> None:
    """Apply a batch of accepted webhook bodies: every status in one `statuses_apply` (monotonic,
    whatever the order), every preference in one `preferences_apply` (the latest wins)."""
    status_events: list[StatusEvent] = []
    preference_events: list[PreferenceEvent] = []
    for event in events:
        batch = webhooks.parse(json.loads(event.payload))
        status_events += batch.statuses
        preference_events += batch.preferences
    statuses.statuses_apply(events=status_events)
    statuses.preferences_apply(events=preference_events)
