"""Campaigns' models, one module per family. Django finds an app's models in `campaigns.models`, and
every caller imports them from here."""

from campaigns.models.attribution import CampaignRevenue, LiftSale, SaleAttribution
from campaigns.models.campaign import (
    AUDIENCE_MAX_DAYS,
    CONTENT_COLUMNS,
    CONTENT_FIELDS,
    CONTROL_MAX_PERCENT,
    BodyFormat,
    Campaign,
    CampaignMetric,
    Channel,
    Kind,
    Sender,
)
from campaigns.models.messages import (
    MESSAGE_FKS,
    OUTCOME_UNKNOWN,
    BounceType,
    CampaignMessage,
    EmailMessage,
    TestSend,
    WhatsappMessage,
    message_constraints,
    message_indexes,
)

# A stored path: migrations 0001, 0003 and 0011 name `campaigns.models._token` (the link token's
# default), so it stays importable from here.
from campaigns.models.messages import _token as _token
from campaigns.models.segments import CustomerSegment, Segment, SegmentMovement

__all__ = [
    "AUDIENCE_MAX_DAYS",
    "CONTENT_COLUMNS",
    "CONTENT_FIELDS",
    "CONTROL_MAX_PERCENT",
    "MESSAGE_FKS",
    "OUTCOME_UNKNOWN",
    "BodyFormat",
    "BounceType",
    "Campaign",
    "CampaignMessage",
    "CampaignMetric",
    "CampaignRevenue",
    "Channel",
    "CustomerSegment",
    "EmailMessage",
    "Kind",
    "LiftSale",
    "SaleAttribution",
    "Segment",
    "SegmentMovement",
    "Sender",
    "TestSend",
    "WhatsappMessage",
    "message_constraints",
    "message_indexes",
]
