from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class RunnerConfig(AppConfig):
    name = "runner"
    verbose_name = _("Integration runner")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """What the runner plugs into the platform, all of it listed here."""
        from crm import inbox_kinds, prometheus, recovery
        from runner import cache, events, executions, metrics
        from runner import recovery as unfinished_work

        cache.connect_signals()  # a handler's or integration's save invalidates the types cache
        inbox_kinds.register(events.WEBHOOK_KIND)(events.webhooks_store)
        recovery.register("runner")(unfinished_work.unfinished)
        recovery.gives_up(executions.ITEM_FUNC)(unfinished_work.items_given_up)
        recovery.gives_up(executions.RUN_FUNC)(unfinished_work.execution_given_up)
        recovery.gives_up(executions.FEED_FUNC)(unfinished_work.execution_given_up)
        prometheus.register_collector("runner.circuits_and_dlq", metrics.collect_circuits_and_dlq)
