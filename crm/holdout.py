"""An organization's global holdout: `holdout_percent` (0-15) of its customers never receive
marketing campaigns or flows, so what marketing as a whole causes can be measured against them.

A customer's bucket is computed in SQL from a hash of (organization, customer, salt) —
``hashtextextended('<org>:<customer>:<salt>', 0)`` taken modulo 10,000 — so it is sticky (the same
customer stays in or out while the salt stays), costs nothing to store, and is one expression in
any query over customers (`holdout_sql`): the campaign audience excludes it, and a flow calls the
same fragment (or `in_holdout` for a few customers). Reshuffling (`holdout_reshuffle`) draws a new
salt and records the period that ends with the old one (HoldoutPeriod), so who was held out before
can be computed again from history.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from crm.models import HOLDOUT_MAX_PERCENT, HoldoutPeriod, Organization

BUCKETS = 10_000  # a bucket is 0.01%


def holdout_sql(*, customer_column: str, organization: Organization) -> tuple[str, list[Any]]:
    """A boolean SQL expression, true when the customer in `customer_column` (a bigint column or
    expression) is in the organization's global holdout as it is now; with its parameters. Always
    false when the holdout is 0%."""
    percent = organization.holdout_percent
    if not percent:
        return "false", []
    return (
        f"((hashtextextended(%s || ':' || ({customer_column})::text || ':' || %s, 0) & 2147483647) "
        f"%% {BUCKETS} < %s)",
        [str(organization.pk), organization.holdout_salt, percent * BUCKETS // 100],
    )


def in_holdout(*, organization: Organization, customer_ids: Iterable[int]) -> set[int]:
    """Those of `customer_ids` in the organization's global holdout (one statement)."""
    ids = sorted(set(customer_ids))
    if not ids or not organization.holdout_percent:
        return set()
    condition, params = holdout_sql(customer_column="given.id", organization=organization)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT given.id FROM unnest(%s::bigint[]) AS given(id) WHERE {condition}",  # noqa: S608
            [ids, *params],
        )
        return {row[0] for row in cursor.fetchall()}


def holdout_set(*, organization: Organization, percent: int, reshuffle: bool = False) -> HoldoutPeriod | None:
    """Set the organization's holdout share (0-15) and, with `reshuffle`, draw a new salt; the
    period that ends is kept (HoldoutPeriod). Returns the current period (None at 0%)."""
    if not 0 <= percent <= HOLDOUT_MAX_PERCENT:
        raise ValueError(f"holdout_percent must be 0-{HOLDOUT_MAX_PERCENT}")
    with transaction.atomic():
        org = Organization.objects.select_for_update().get(pk=organization.pk)
        now = timezone.now()
        current = HoldoutPeriod.objects.filter(organization=org, ended_at__isnull=True).first()
        if current and (reshuffle or current.percent != percent or current.salt != org.holdout_salt):
            HoldoutPeriod.objects.filter(pk=current.pk).update(ended_at=now)
            current = None
        if reshuffle:
            org.holdout_salt = secrets.token_hex(8)
        org.holdout_percent = percent
        org.save(update_fields=["holdout_percent", "holdout_salt"])
        if percent and current is None:
            current = HoldoutPeriod.objects.create(
                organization=org, salt=org.holdout_salt, percent=percent, started_at=now
            )
    organization.holdout_percent, organization.holdout_salt = org.holdout_percent, org.holdout_salt
    return current
