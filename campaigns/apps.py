from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class CampaignsConfig(AppConfig):
    name = "campaigns"
    verbose_name = _("Campaigns")

    def ready(self) -> None:
        """What campaigns plug into the platform, all of it listed here."""
        from django.db.models.signals import pre_delete

        from campaigns import attribution, customer_page, inbox, lifecycle, lift, metrics, selectors  # noqa: F401
        from campaigns import recovery as unfinished_work
        from campaigns.models import Campaign, Segment
        from crm import customer_filters, hooks, inbox_kinds, prometheus, recovery

        customer_filters.segment_lookup_register(selectors.segment_customers, list(Segment.choices))
        inbox_kinds.register(inbox.KIND)(inbox.webhooks_apply)
        inbox_kinds.register(inbox.ESP)(inbox.esp_events_apply)
        recovery.register("campaign-triggers")(unfinished_work.scheduled_starts)
        recovery.register("whatsapp-batches")(unfinished_work.whatsapp_batches_unfinished)
        recovery.register("email-batches")(unfinished_work.email_batches_unfinished)
        recovery.gives_up("campaigns.tasks.whatsapp_send_batch")(unfinished_work.whatsapp_batch_given_up)
        recovery.gives_up("campaigns.tasks.email_send_batch")(unfinished_work.email_batch_given_up)
        recovery.gives_up("campaigns.tasks.campaign_fanout")(unfinished_work.fanout_given_up)
        recovery.gives_up("campaigns.tasks.campaign_trigger")(unfinished_work.trigger_given_up)
        prometheus.register_collector("campaigns.messages", metrics.collect_messages)
        pre_delete.connect(lifecycle.campaign_deleting, sender=Campaign, dispatch_uid="campaigns.deleting")
        # The lift rollups (campaigns.lift): per campaign with a control group, not last touch.
        hooks.on_sales_written("lift", lift.sales_written, order=90)
        # Last: its statement takes the organization's attribution lock, held until the commit.
        hooks.on_sales_written("attributed", attribution.sales_written, order=100)
