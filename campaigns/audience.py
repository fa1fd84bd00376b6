"""Who a campaign will reach, before it starts: by the rules its fan-out applies.

The audience (selectors.campaign_audience: consent, opt-out, a phone or an address, suppressed
addresses, the audience's filters) is counted with aggregate queries; the contact caps
(campaigns.caps.skip_reasons, the fan-out's own statement) are applied, page by page, to its
customers with a message history (the others no cap can skip), so the count of who is skipped by
a cap is the fan-out's, and memory stays one page whatever the audience's size. The estimated
cost prices each recipient at their country's rate (the calling code's, as a sent message is
priced) in the rate card's currency.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal

from django.db.models import Count
from django.db.models.functions import Substr
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from campaigns import caps, selectors
from campaigns.models import Campaign, Channel, CustomerSegment
from integrations.models import WhatsappPrice
from integrations.services import whatsapp_price_currency
from integrations.whatsapp.phones import phone_region

PAGE = 20_000

# Why a customer the audience's filters select does not receive the campaign, in the order shown.
SKIP_LABELS = {
    "no_consent": _("no consent"),
    "opted_out": _("opted out"),
    "no_contact": _("no phone or address"),
    "suppressed": _("address suppressed (bounce or complaint)"),
    "contact_cap": _("contact cap"),
    "another_campaign": _("another campaign within 24 hours"),
    "global_holdout": _("global holdout (never receives marketing)"),
    "control_group": _("control group (held out to measure the lift; estimated)"),
}


@dataclass(frozen=True)
class AudiencePreview:
    """The campaign's audience now: who the filters select, who receives it, who is skipped by
    reason (SKIP_LABELS' keys), the estimated cost (None for a channel without a per-message
    price) and, when nobody receives it, why (`problem`)."""

    selected: int
    receives: int
    skipped: dict[str, int] = field(default_factory=dict)
    cost: Decimal | None = None
    currency: str = ""
    problem: str = ""


def segment_without_snapshot(*, campaign: Campaign) -> bool:
    """Does the campaign's audience name an RFM segment while its organization has no snapshot yet?"""
    segment = campaign.audience_segment or (campaign.audience_filter or {}).get("segment")
    return bool(segment) and not (
        CustomerSegment.objects.filter(organization_id=campaign.organization_id).exists()
    )


def _capped_and_regions(campaign: Campaign) -> tuple[Counter[str], Counter[str]]:
    """(the receiving audience skipped by the contact caps, by kind; the others, by their phone's
    calling-code prefix). The prefixes are one GROUP BY over the audience; the caps' statement runs
    only over the audience's customers with a message history (caps.with_history), in pages."""
    now = timezone.now()
    skipped: Counter[str] = Counter()
    audience = selectors.campaign_audience(campaign=campaign)
    prefix = Substr("phone", 2, 3)
    prefixes: Counter[str] = Counter(
        {
            row["prefix"] or "": row["n"]
            for row in audience.annotate(prefix=prefix).values("prefix").annotate(n=Count("pk")).order_by()
        }
    )
    candidates = caps.with_history(campaign=campaign, customers=audience, now=now)
    after = 0
    while True:
        page = list(candidates.filter(pk__gt=after).order_by("pk").values_list("pk", prefix)[:PAGE])
        if not page:
            break
        capped = caps.skip_reasons(campaign=campaign, customer_ids=[pk for pk, _ in page], now=now)
        skipped.update(caps.reason_kind(reason) for reason in capped.values())
        prefixes.subtract(prefix or "" for pk, prefix in page if pk in capped)
        after = page[-1][0]
        if len(page) < PAGE:
            break
    return skipped, +prefixes


def _whatsapp_cost(campaign: Campaign, prefixes: Counter[str]) -> tuple[Decimal, str]:
    currency = whatsapp_price_currency()
    prices = dict(
        WhatsappPrice.objects.filter(category=campaign.template_category, currency=currency).values_list(
            "country", "price"
        )
    )
    fallback = prices.get("*", Decimal("0"))
    cost = sum(
        (n * prices.get(phone_region("+" + prefix), fallback) for prefix, n in prefixes.items()),
        Decimal("0"),
    )
    return cost, currency


def audience_problem(*, campaign: Campaign, counts: dict[str, int] | None = None) -> str:
    """Why nobody would receive the campaign, or "" when someone would (caps apart: a customer a
    cap skips today is in the audience). One EXISTS when someone would."""
    if segment_without_snapshot(campaign=campaign):
        return str(
            _(
                "the audience is the RFM segment '%(segment)s' and the organization has no segment "
                "snapshot yet: take one (Segments, or manage.py segments_snapshot) first"
            )
            % {"segment": campaign.audience_segment or campaign.audience_filter.get("segment")}
        )
    if counts is None:
        if selectors.campaign_audience(campaign=campaign).exists():
            return ""
        counts = selectors.campaign_audience_counts(campaign=campaign)
    if counts["receives"]:
        return ""
    if not counts["selected"]:
        return str(_("the audience is empty: no customer matches its filters"))
    reasons = ", ".join(f"{n} {SKIP_LABELS[key]}" for key, n in _skips(counts).items() if n)
    return str(_("nobody would receive it: %(reasons)s") % {"reasons": reasons})


def _skips(counts: dict[str, int]) -> dict[str, int]:
    suppressed = counts["selected"] - counts["no_consent"] - counts["opted_out"] - counts["no_contact"]
    held = counts.get("global_holdout", 0)
    return {
        "no_consent": counts["no_consent"],
        "opted_out": counts["opted_out"],
        "no_contact": counts["no_contact"],
        "suppressed": suppressed - counts["receives"] - held,
        "global_holdout": held,
    }


def audience_preview(*, campaign: Campaign) -> AudiencePreview:
    """The audience before the start, by the fan-out's rules (see the module's docstring)."""
    counts = selectors.campaign_audience_counts(campaign=campaign)
    problem = audience_problem(campaign=campaign, counts=counts)
    skipped = _skips(counts)
    capped, prefixes = _capped_and_regions(campaign) if counts["receives"] else (Counter(), Counter())
    skipped.update({kind: capped.get(kind, 0) for kind in ("contact_cap", "another_campaign")})
    receives = counts["receives"] - sum(capped.values())
    # The control group is drawn at random after the caps (campaigns.lift): its expected size.
    skipped["control_group"] = round(receives * campaign.control_percent / 100)
    cost: Decimal | None = None
    currency = ""
    if campaign.channel == Channel.WHATSAPP:
        cost, currency = _whatsapp_cost(campaign, prefixes)
    return AudiencePreview(
        selected=counts["selected"],
        receives=receives - skipped["control_group"],
        skipped=skipped,
        cost=cost,
        currency=currency,
        problem=problem,
    )
