from django.apps import AppConfig
from django.db.models.signals import post_save
from django.utils.translation import gettext_lazy as _


class SurveysConfig(AppConfig):
    name = "surveys"
    verbose_name = _("Post-sale surveys")

    def ready(self) -> None:
        from crm.models import Sale
        from surveys import services  # also registers the recoverer

        post_save.connect(services.sale_saved, sender=Sale, dispatch_uid="surveys.sale_saved")
