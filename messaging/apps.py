from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class MessagingConfig(AppConfig):
    name = "messaging"
    verbose_name = _("Messaging")

    def ready(self) -> None:
        """Chatwoot's agent replies (an inbox kind), the push of what waits for Chatwoot (a recoverer,
        a metric, and a push when the organization's Chatwoot account is saved), the conversation
        on the customer's page and its admin."""
        from django.db.models.signals import post_save
        from django.utils.translation import gettext_lazy as _

        from crm import customer_page, inbox_kinds, prometheus
        from integrations.models import ChatwootAccount
        from messaging import admin_conversations, chatwoot_inbound, chatwoot_replies  # noqa: F401
        from messaging import customer_page as conversation_page

        inbox_kinds.register(chatwoot_replies.KIND)(chatwoot_replies.replies_apply)
        customer_page.on_customer_section(
            "replies", _("WhatsApp conversation"), conversation_page.replies, order=40
        )
        prometheus.register_collector("messaging.chatwoot_waiting", chatwoot_inbound.collect_waiting)
        post_save.connect(
            chatwoot_inbound.account_saved,
            sender=ChatwootAccount,
            dispatch_uid="messaging.chatwoot_account_saved",
        )
