from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class RunnerConfig(AppConfig):
    name = "runner"
    verbose_name = _("Integration runner")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from runner import cache, metrics, services  # noqa: F401  (signals; /metrics; the recoverer)

        cache.connect_signals()
