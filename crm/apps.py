from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class CrmConfig(AppConfig):
    name = "crm"
    verbose_name = _("CRM core")

    def ready(self) -> None:
        from crm import checks  # noqa: F401 - registers the system checks
