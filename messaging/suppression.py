"""The organization's email suppression list, read and written the same way by every sender."""

from __future__ import annotations

from collections.abc import Iterable

from messaging.models import EmailSuppression

SUPPRESSED = "address suppressed (an earlier hard bounce or complaint)"


def suppressed_addresses(*, organization_id: int, addresses: Iterable[str]) -> set[str]:
    """Those of `addresses` (compared lower-cased, as stored) the organization never emails again."""
    wanted = {address.strip().lower() for address in addresses}
    return set(
        EmailSuppression.objects.filter(organization_id=organization_id, email__in=wanted).values_list(
            "email", flat=True
        )
    )


def addresses_suppress(
    *,
    organization_id: int,
    entries: Iterable[tuple[str, str]],
    reason: str = EmailSuppression.Reason.HARD_BOUNCE,
) -> None:
    """Suppress each (address, detail) for the organization; an address already suppressed keeps its row."""
    EmailSuppression.objects.bulk_create(
        [
            EmailSuppression(
                organization_id=organization_id,
                email=address.strip().lower(),
                reason=reason,
                detail=detail[:2000],
            )
            for address, detail in entries
        ],
        ignore_conflicts=True,
    )
