"""The ERP syncs' counter on /metrics (registered with crm.prometheus by ErpConfig.ready)."""

from __future__ import annotations

from crm import prometheus


def counters_register() -> None:
    """The sync counter, on /metrics from the first scrape (zero until a sync runs)."""
    prometheus.register_counter(
        "erp_sync_rows",
        "ERP records synced (upserted, an unchanged one included), by kind.",
        labels=("kind",),
        always=(("customers",), ("sales",)),
    )
