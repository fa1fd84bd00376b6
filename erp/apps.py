from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class ErpConfig(AppConfig):
    name = "erp"
    verbose_name = _("ERP")

    def ready(self) -> None:
        """What the ERP syncs plug into the platform, all of it listed here."""
        from erp import metrics

        metrics.counters_register()
