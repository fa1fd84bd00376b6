from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class IntegrationsConfig(AppConfig):
    name = "integrations"
    verbose_name = _("Integrations")

    def ready(self) -> None:
        from integrations import outbound
        from integrations.models import TrustedOrigin

        def trust(origin: str) -> None:
            TrustedOrigin.objects.get_or_create(origin=origin)

        # The SSRF guard (a provider module: it imports no model) reads the trusted origins here.
        outbound.use_trusted_origin_store(
            outbound.TrustedOriginStore(
                load=lambda: TrustedOrigin.objects.values_list("origin", flat=True), add=trust
            )
        )
