from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class CampaignsConfig(AppConfig):
    name = "campaigns"
    verbose_name = _("Campaigns")

    def ready(self) -> None:
        from django.db.models.signals import post_save, pre_delete

        from campaigns import attribution, inbox, services  # noqa: F401 - the recoverer, the inbox handler
        from campaigns.models import Campaign
        from crm.models import Sale

        pre_delete.connect(services.campaign_deleting, sender=Campaign, dispatch_uid="campaigns.deleting")
        post_save.connect(attribution.sale_saved, sender=Sale, dispatch_uid="campaigns.sale_attribution")
