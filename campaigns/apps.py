from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class CampaignsConfig(AppConfig):
    name = "campaigns"
    verbose_name = _("Campaigns")

    def ready(self) -> None:
        from anymail.signals import tracking
        from django.db.models.signals import pre_delete

        from campaigns import esp_tracking, services  # services registers the recoverer too
        from campaigns.models import Campaign

        tracking.connect(esp_tracking.on_tracking, dispatch_uid="campaigns.esp_tracking")
        pre_delete.connect(services.campaign_deleting, sender=Campaign, dispatch_uid="campaigns.deleting")
