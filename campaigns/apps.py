from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class CampaignsConfig(AppConfig):
    name = "campaigns"
    verbose_name = _("Campaigns")

    def ready(self) -> None:
        from django.db.models.signals import pre_delete

        # The recoverer, the inbox handler, the /metrics collector, the organization dashboard.
        from campaigns import admin_dashboard, attribution, customer_page, inbox, metrics, services  # noqa: F401
        from campaigns.models import Campaign
        from crm import hooks

        pre_delete.connect(services.campaign_deleting, sender=Campaign, dispatch_uid="campaigns.deleting")
        # Last: its statement takes the organization's attribution lock, held until the commit.
        hooks.on_sales_written("attributed", attribution.sales_written, order=100)
