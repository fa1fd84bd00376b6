"""The inbound webhooks this app applies from the inbox (crm/inbox.py), in batches: Meta's status,
preference and inbound message webhooks (kind "whatsapp") and the ESPs' tracking events (kind "esp")."""

from __future__ import annotations

import json
from collections import defaultdict

from anymail.signals import AnymailTrackingEvent

from campaigns import conversations, esp_tracking, statuses
from crm import inbox_kinds
from integrations.email import tracking
from integrations.whatsapp import webhooks
from integrations.whatsapp.webhooks import InboundMessage, PreferenceEvent, StatusEvent

KIND = "whatsapp"
ESP = "esp"


def webhooks_apply(events: list[inbox_kinds.Event]) -> None:
    """Apply a batch of accepted webhook bodies: every status in one `statuses_apply` (monotonic,
    whatever the order), every preference in one `preferences_apply` (the latest wins), every
    inbound message in one `inbound_apply` (once per wamid, keywords honoured)."""
    status_events: list[StatusEvent] = []
    preference_events: list[PreferenceEvent] = []
    inbound: list[InboundMessage] = []
    for event in events:
        batch = webhooks.parse(json.loads(event.payload))
        status_events += batch.statuses
        preference_events += batch.preferences
        inbound += batch.messages
    statuses.statuses_apply(events=status_events)
    statuses.preferences_apply(events=preference_events)
    if inbound:
        conversations.inbound_apply(messages=inbound)


def esp_payload(provider: str, raws: list[dict]) -> str:
    """What the ESP intake stores: the provider and its raw events (already checked readable)."""
    return json.dumps({"provider": provider, "events": raws}, ensure_ascii=False)


def esp_events_apply(events: list[inbox_kinds.Event]) -> dict[int, inbox_kinds.Retry]:
    """Apply a batch of accepted ESP tracking bodies: the events of each provider and organization
    together (one lookup of their messages), in the order they were accepted. An event for a
    message whose send is not recorded yet stays in the inbox, with only those raw events, to be
    applied on a later try (returned as a Retry)."""
    groups: dict[tuple[str, int | None], list[AnymailTrackingEvent]] = defaultdict(list)
    origin: dict[int, tuple[int, dict]] = {}  # id() of a parsed event -> (its inbox event, its raw)
    providers: dict[int, str] = {}
    for event in events:
        body = json.loads(event.payload)
        provider = providers[event.id] = body["provider"]
        parsed = tracking.events(provider, body["events"])  # one normalized event per raw one
        for normalized, raw in zip(parsed, body["events"], strict=True):
            origin[id(normalized)] = (event.id, raw)
        groups[(provider, event.organization_id)] += parsed
    early: dict[int, list[tuple[dict, str]]] = defaultdict(list)
    for (provider, organization_id), parsed in groups.items():
        for normalized in esp_tracking.events_apply(
            esp_name=tracking.esp_name(provider), events=parsed, organization_id=organization_id
        ):
            event_id, raw = origin[id(normalized)]
            early[event_id].append((raw, str(normalized.message_id)))
    return {
        event_id: inbox_kinds.Retry(
            payload=esp_payload(providers[event_id], [raw for raw, _ in kept]),
            reason="no message recorded with ESP message id "
            + ", ".join(sorted({message_id for _, message_id in kept})),
        )
        for event_id, kept in early.items()
    }
