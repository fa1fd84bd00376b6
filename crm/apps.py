from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class CrmConfig(AppConfig):
    name = "crm"
    verbose_name = _("CRM core")

    def ready(self) -> None:
        """What the platform plugs into Django and into itself, all of it listed here (apps list theirs
        in their own AppConfig.ready)."""
        from django.core import checks as django_checks
        from django.db.models.signals import post_delete, post_save

        from crm import admin_thirdparty, checks, hooks, inbox, recovery
        from crm import services as crm_services
        from crm.models import Customer, Membership, Organization, Sale

        django_checks.register(checks.check_public_url, django_checks.Tags.security)
        admin_thirdparty.register()  # after the admin's autodiscovery registered them
        recovery.register("inbox")(inbox.stranded)

        saved, deleted = crm_services.membership_saved, crm_services.membership_deleted
        post_save.connect(saved, sender=Membership, dispatch_uid="crm.membership_saved")
        post_delete.connect(deleted, sender=Membership, dispatch_uid="crm.membership_deleted")
        post_save.connect(
            crm_services.organization_saved, sender=Organization, dispatch_uid="crm.organization_saved"
        )
        post_save.connect(hooks.sale_saved, sender=Sale, dispatch_uid="crm.sale_saved")
        post_save.connect(hooks.customer_saved, sender=Customer, dispatch_uid="crm.customer_saved")
