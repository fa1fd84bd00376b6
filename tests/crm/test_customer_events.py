"""The customer-events hook: every registered consumer sees each batch once, in order."""

from datetime import UTC, datetime

import pytest

from crm import hooks


@pytest.mark.django_db
def test_consumers_see_each_batch_in_order_and_unknown_kinds_are_refused():
    # The product's own consumers (flows) run too, on an organization that does not exist.
    seen: list[tuple[str, int]] = []
    hooks.on_customer_events("test-b", lambda events: seen.append(("b", len(events))) or len(events))
    hooks.on_customer_events("test-a", lambda events: seen.append(("a", len(events))) or 0, order=-1)
    try:
        event = hooks.CustomerEvent("whatsapp_reply", 1, 2, datetime.now(UTC), key="wamid.X")
        counts = hooks.customer_events([event, event])
        assert counts["test-b"] == 2 and counts["test-a"] == 0
        assert [name for name, _ in seen] == ["a", "b"]
        with pytest.raises(ValueError, match="bogus"):
            hooks.customer_events([hooks.CustomerEvent("bogus", 1, 2, datetime.now(UTC))])
        assert hooks.customer_events([])["test-b"] == 0
    finally:
        hooks.off_customer_events("test-a")
        hooks.off_customer_events("test-b")
