"""The demo's sales that respond to a campaign: after a demo campaign with a control group has been
sent, each of its customers buys within the window with a base probability, and a treated one
with a modest uplift on top, so its lift report shows something true (`manage.py
demo_campaign_sales`). Written like the ERP's pages, through the "sales written" hook."""

from __future__ import annotations

from django.db import connection, transaction

from campaigns.lift import window_days
from campaigns.models import Campaign
from crm import bulk, hooks
from crm.models import Sale, Store

# The sales: per message sent or held out, one sale with the arm's probability, at a random time
# between the (would-be) send and the end of its window or now, whichever comes first.
_SALES = (
    "SELECT %s, %s, m.customer_id, 'DEMO-LIFT-' || m.campaign_id || '-' || m.id, "
    "round((60 + random() * 340)::numeric, 2), "
    "m.sent_at + random() * (least(now(), m.sent_at + make_interval(days => %s)) - m.sent_at), "
    "'[]'::jsonb, now() "
    "FROM {table} m WHERE m.campaign_id = %s AND m.sent_at IS NOT NULL AND m.sent_at <= now() "
    "AND random() < CASE WHEN m.status = 'held_out' THEN %s ELSE %s END"
)


def demo_campaign_sales(*, campaign: Campaign, base_rate: float = 0.05, uplift: float = 0.3) -> int:
    """Write the campaign's customers' purchases in its window: the control group buys at
    `base_rate`, the treated at `base_rate * (1 + uplift)`. Returns how many sales (at most one per
    message: its ERP id; run it once per campaign, a second run draws again for the others)."""
    store = Store.objects.filter(organization_id=campaign.organization_id).order_by("pk").first()
    if store is None:
        return 0
    days = window_days(organization=campaign.organization, channel=campaign.channel)
    fields = (
        "organization_id",
        "store_id",
        "customer_id",
        "erp_id",
        "total",
        "sold_at",
        "items",
        "created_at",
    )
    select = _SALES.format(table=campaign.message_model._meta.db_table)
    sql, defaults = bulk.insert_select(Sale, fields, select, ignore_conflicts=True)
    params = [
        *defaults,
        campaign.organization_id,
        store.pk,
        days,
        campaign.pk,
        base_rate,
        base_rate * (1 + uplift),
    ]
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(sql + " RETURNING id", params)
            ids = [row[0] for row in cursor.fetchall()]
        for start in range(0, len(ids), 1000):
            page = ids[start : start + 1000]
            hooks.sales_written(organization_id=campaign.organization_id, sale_ids=page, created_ids=page)
    return len(ids)
