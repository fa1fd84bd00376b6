from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class MessagingConfig(AppConfig):
    name = "messaging"
    verbose_name = _("Messaging")

    def ready(self) -> None:
        """Chatwoot's agent replies (an inbox kind) and the push of what waits for Chatwoot (a recoverer)."""
        from crm import inbox
        from messaging import chatwoot_inbound, chatwoot_replies  # noqa: F401

        inbox.register(chatwoot_replies.KIND)(chatwoot_replies.replies_apply)
