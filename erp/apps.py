from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class ErpConfig(AppConfig):
    name = "erp"
    verbose_name = _("ERP")
