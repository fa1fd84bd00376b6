"""What the campaign commands share: finding the campaign named on the command line."""

from __future__ import annotations

from django.core.management.base import CommandError

from campaigns.models import Campaign


def campaign_or_error(campaign_id: int) -> Campaign:
    campaign = Campaign.objects.filter(pk=campaign_id).first()
    if campaign is None:
        raise CommandError(f"no campaign {campaign_id}")
    return campaign
