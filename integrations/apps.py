from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class IntegrationsConfig(AppConfig):
    name = "integrations"
    verbose_name = _("Integrations")

    def ready(self) -> None:
        import threading

        from django.db import connection

        from integrations import outbound
        from integrations.models import TrustedOrigin

        def trust(origin: str) -> None:
            TrustedOrigin.objects.get_or_create(origin=origin)

        def load() -> list[str]:
            origins = list(TrustedOrigin.objects.values_list("origin", flat=True))
            # The guard also runs in helper threads (an event loop's executor, the email senders'
            # pool) that no request or job cycle ever closes: they keep no idle session behind.
            if threading.current_thread() is not threading.main_thread() and not connection.in_atomic_block:
                connection.close()
            return origins

        # The SSRF guard (a provider module: it imports no model) reads the trusted origins here.
        outbound.use_trusted_origin_store(outbound.TrustedOriginStore(load=load, add=trust))
