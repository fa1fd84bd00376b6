from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class ProjectConfig(AppConfig):
    """Installed for its management commands (`demo`, `up`): it has no models."""

    name = "project"
    verbose_name = _("Project")
