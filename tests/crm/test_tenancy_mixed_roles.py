"""A user who manages one organization and only views another writes into the first only: the
forms' choices, the save itself and the actions take the organizations the user manages, not those it sees."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from campaigns.models import Campaign
from crm.models import Customer, Membership, Organization, Sale, Store

pytestmark = pytest.mark.django_db

User = get_user_model()


@pytest.fixture
def mixed(client):
    a = Organization.objects.create(name="Loja A", slug="loja-a")
    b = Organization.objects.create(name="Loja B", slug="loja-b")
    user = User.objects.create_user("marta", password="pw-marta-123", is_staff=True)
    Membership.objects.create(user=user, organization=a, role="manager")
    Membership.objects.create(user=user, organization=b, role="viewer")
    client.force_login(user)
    return client, a, b


def _campaign_form(organization: Organization, name: str) -> dict[str, str]:
    return {
        "organization": str(organization.pk),
        "name": name,
        "channel": "whatsapp",
        "status": "draft",
        **{f.name: f.get_default() for f in Campaign._meta.fields if f.name in REQUIRED_WITH_DEFAULTS},
        "_save": "Save",
    }


REQUIRED_WITH_DEFAULTS = (
    "template_language",
    "template_category",
    "email_body_format",
    "recurrence_misfire",
    "sender",
)


def test_a_new_campaign_cannot_be_put_in_an_organization_the_user_only_views(mixed):
    client, a, b = mixed
    page = client.get("/admin/campaigns/campaign/add/").content.decode()
    assert f'value="{a.pk}"' in page and f'value="{b.pk}"' not in page
    client.post("/admin/campaigns/campaign/add/", _campaign_form(b, "into B"))
    assert not Campaign.objects.filter(name="into B").exists()
    client.post("/admin/campaigns/campaign/add/", _campaign_form(a, "into A"))
    assert Campaign.objects.get(name="into A").organization == a


def test_a_campaign_cannot_be_moved_into_an_organization_the_user_only_views(mixed):
    client, a, b = mixed
    campaign = Campaign.objects.create(organization=a, name="mine")
    client.post(f"/admin/campaigns/campaign/{campaign.pk}/change/", _campaign_form(b, "moved"))
    campaign.refresh_from_db()
    assert (campaign.organization, campaign.name) == (a, "mine")


def test_a_viewed_organizations_customer_cannot_be_picked_in_a_managed_organizations_form(mixed):
    client, a, b = mixed
    store = Store.objects.create(organization=a, erp_code="001", name="Centro")
    theirs = Customer.objects.create(organization=b, name="Cliente de B")
    mine = Customer.objects.create(organization=a, name="Cliente de A")

    def sale(customer: Customer, erp_id: str) -> None:
        form = {
            "organization": str(a.pk),
            "store": str(store.pk),
            "customer": str(customer.pk),  # a raw id field: any id can be typed
            "erp_id": erp_id,
            "total": "10.00",
            "sold_at_0": "2026-11-30",
            "sold_at_1": "10:00:00",
            "_save": "Save",
        }
        client.post("/admin/crm/sale/add/", form)

    sale(theirs, "S-THEIRS")
    sale(mine, "S-MINE")
    assert list(Sale.objects.values_list("erp_id", "customer_id")) == [("S-MINE", mine.pk)]


def test_an_action_runs_only_on_the_rows_of_organizations_the_user_manages(mixed):
    """The changelist shows A's and B's rows; an action posted with both selected changes A's only
    (a viewer of B may not resume, start or delete anything of B's)."""
    from django.utils import timezone

    from integrations.models import WhatsappNumber

    client, a, b = mixed
    numbers = {
        org.slug: WhatsappNumber.objects.create(
            organization=org,
            phone_number_id=f"pn-{org.slug}",
            display_phone_number=f"+551190{org.pk:04d}",
            paused_at=timezone.now(),
            paused_reason="131048",
        )
        for org in (a, b)
    }
    page = client.get("/admin/integrations/whatsappnumber/").content.decode()
    assert "pn-loja-a" in page or numbers["loja-a"].display_phone_number in page
    client.post(
        "/admin/integrations/whatsappnumber/",
        {"action": "resume_sending", "_selected_action": [n.pk for n in numbers.values()], "index": 0},
    )
    numbers["loja-a"].refresh_from_db()
    numbers["loja-b"].refresh_from_db()
    assert numbers["loja-a"].paused_at is None
    assert numbers["loja-b"].paused_at is not None and numbers["loja-b"].paused_reason == "131048"
