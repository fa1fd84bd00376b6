from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class SurveysConfig(AppConfig):
    name = "surveys"
    verbose_name = _("Post-sale surveys")

    def ready(self) -> None:
        """What surveys plug into the platform, all of it listed here (customer_page: its section)."""
        from crm import hooks, recovery
        from surveys import customer_page, services  # noqa: F401

        hooks.on_sales_written("surveys", services.sales_written)
        recovery.register("post-sale-surveys")(services.due_surveys)
        recovery.gives_up(services.SEND_FUNC)(services.send_given_up)
