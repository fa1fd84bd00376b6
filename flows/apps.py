from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class FlowsConfig(AppConfig):
    name = "flows"
    verbose_name = _("Flows")

    def ready(self) -> None:
        """What flows plug into the platform: the sale and customer-event triggers, the recoverer."""
        from crm import hooks, recovery
        from flows import triggers

        hooks.on_sales_written("flows", triggers.sales_written, order=50)
        hooks.on_customer_events("flows", triggers.customer_events)
        recovery.register("flow-steps")(triggers.due_specs)
