"""The inbound webhooks this app applies from the inbox (crm/inbox.py), in batches: Meta's status and
preference webhooks (kind "whatsapp") and the ESPs' tracking events (kind "esp")."""

from __future__ import annotations

import json
from collections import defaultdict

from anymail.signals import AnymailTrackingEvent

from campaigns import esp_tracking, statuses
from crm import inbox
from integrations.email import tracking
from integrations.whatsapp import webhooks
from integrations.whatsapp.webhooks import PreferenceEvent, StatusEvent

KIND = "whatsapp"
ESP = "esp"


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


def esp_payload(provider: str, raws: list[dict]) -> str:
    """What the ESP intake stores: the provider and its raw events (already checked readable)."""
    return json.dumps({"provider": provider, "events": raws}, ensure_ascii=False)


@inbox.register(ESP)
def esp_events_apply(events: list[inbox.Event]) -> None:
    """Apply a batch of accepted ESP tracking bodies: the events of each provider and organization
    together (one lookup of their messages), in the order they were accepted."""
    groups: dict[tuple[str, int | None], list[AnymailTrackingEvent]] = defaultdict(list)
    for event in events:
        body = json.loads(event.payload)
        provider = body["provider"]
        groups[(provider, event.organization_id)] += tracking.events(provider, body["events"])
    for (provider, organization_id), parsed in groups.items():
        esp_tracking.events_apply(
            esp_name=tracking.esp_name(provider), events=parsed, organization_id=organization_id
        )
