from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class CampaignsConfig(AppConfig):
    name = "campaigns"
    verbose_name = _("Campaigns")

    def ready(self) -> None:
        from anymail.signals import tracking

        from campaigns import esp_tracking, inbox, services  # noqa: F401 - the recoverer, the inbox handler

        tracking.connect(esp_tracking.on_tracking, dispatch_uid="campaigns.esp_tracking")
