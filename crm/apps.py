from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class CrmConfig(AppConfig):
    name = "crm"
    verbose_name = _("CRM core")

    def ready(self) -> None:
        from django.db.models.signals import post_delete, post_save

        from crm import checks, hooks  # noqa: F401 - checks: registers the system checks
        from crm import services as crm_services
        from crm.models import Membership, Sale

        saved, deleted = crm_services.membership_saved, crm_services.membership_deleted
        post_save.connect(saved, sender=Membership, dispatch_uid="crm.membership_saved")
        post_delete.connect(deleted, sender=Membership, dispatch_uid="crm.membership_deleted")
        post_save.connect(hooks.sale_saved, sender=Sale, dispatch_uid="crm.sale_saved")
