from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class ProjectConfig(AppConfig):
    """Installed for its management commands (`demo`, `up`) and the pages that combine apps (the
    organization's dashboard): it has no models."""

    name = "project"
    verbose_name = _("Project")

    def ready(self) -> None:
        from project import admin_dashboard  # noqa: F401  (mounts the organization's dashboard page)
