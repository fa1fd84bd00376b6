from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class CampaignsConfig(AppConfig):
    name = "campaigns"
    verbose_name = _("Campaigns")

    def ready(self) -> None:
        from django.db.models.signals import pre_delete

        from campaigns import inbox, services  # noqa: F401 - the recoverer, the inbox handler
        from campaigns.models import Campaign

        pre_delete.connect(services.campaign_deleting, sender=Campaign, dispatch_uid="campaigns.deleting")
