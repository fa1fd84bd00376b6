from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class ErpConfig(AppConfig):
    name = "erp"
    verbose_name = _("ERP")

    def ready(self) -> None:
        from erp import metrics  # noqa: F401 - registers the sync counter on /metrics
