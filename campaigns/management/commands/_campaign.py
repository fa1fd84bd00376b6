"""What the campaign commands share: finding the campaign named on the command line."""

from __future__ import annotations

from django.core.management.base import CommandError
from django.utils.translation import gettext as _

from campaigns.models import Campaign


def campaign_or_error(campaign_id: int) -> Campaign:
    campaign = Campaign.objects.filter(pk=campaign_id).first()
    if campaign is None:
        raise CommandError(
            _("no campaign %(id)s (campaign ids are in the admin's Campaigns list)") % {"id": campaign_id}
        )
    return campaign
