from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class SurveysConfig(AppConfig):
    name = "surveys"
    verbose_name = _("Post-sale surveys")

    def ready(self) -> None:
        from crm import hooks
        from surveys import customer_page, services  # noqa: F401 - the recoverer, the customer page's section

        hooks.on_sales_written("surveys", services.sales_written)
