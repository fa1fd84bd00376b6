from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class CampaignsConfig(AppConfig):
    name = "campaigns"
    verbose_name = _("Campaigns")

    def ready(self) -> None:
        from django.db.models.signals import post_save, pre_delete

        # The recoverer, the inbox handler, the /metrics collector, the organization dashboard.
        from campaigns import admin_dashboard, attribution, inbox, metrics, services  # noqa: F401
        from campaigns.models import Campaign
        from crm.models import Sale

        pre_delete.connect(services.campaign_deleting, sender=Campaign, dispatch_uid="campaigns.deleting")
        post_save.connect(attribution.sale_saved, sender=Sale, dispatch_uid="campaigns.sale_attribution")
