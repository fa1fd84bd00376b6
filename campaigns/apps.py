from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class CampaignsConfig(AppConfig):
    name = "campaigns"
    verbose_name = _("Campaigns")

    def ready(self) -> None:
        """What campaigns plug into the platform, listed here, but for the recoverers and give-ups that
        campaigns/services.py still registers as it is imported (until the campaigns split)."""
        from django.db.models.signals import pre_delete

        from campaigns import (  # noqa: F401
            attribution,
            customer_page,
            inbox,
            lift,
            metrics,
            selectors,
            services,
        )
        from campaigns.models import Campaign
        from campaigns.segments import Segment
        from crm import customer_filters, hooks, prometheus
        from crm import inbox as platform_inbox

        customer_filters.segment_lookup_register(selectors.segment_customers, list(Segment.choices))
        platform_inbox.register(inbox.KIND)(inbox.webhooks_apply)
        platform_inbox.register(inbox.ESP)(inbox.esp_events_apply)
        prometheus.register_collector("campaigns.messages", metrics.collect_messages)
        pre_delete.connect(services.campaign_deleting, sender=Campaign, dispatch_uid="campaigns.deleting")
        # The lift rollups (campaigns.lift): per campaign with a control group, not last touch.
        hooks.on_sales_written("lift", lift.sales_written, order=90)
        # Last: its statement takes the organization's attribution lock, held until the commit.
        hooks.on_sales_written("attributed", attribution.sales_written, order=100)
