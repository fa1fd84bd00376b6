"""WhatsApp campaigns sent from each customer's store number: real PostgreSQL, Redis, workers, HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from io import StringIO

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.db.models import Count
from django.utils import timezone

from campaigns import fanout, lifecycle, selectors
from campaigns.models import Campaign, Sender, WhatsappMessage
from campaigns.whatsapp import sending
from crm import jobs, ratelimit
from crm.models import Customer, Organization, Sale, Store
from integrations.models import WhatsappNumber
from integrations.services import whatsapp_numbers_resume
from project.sandboxes.whatsapp import SandboxServer
from tests.campaigns.conftest import PHONE_NUMBER_ID, TOKEN

S = WhatsappMessage.Status
SHOPPING_ID, ONLINE_ID = "109876543211", "109876543212"


@pytest.fixture
def sandbox() -> Iterator[SandboxServer]:
    """The Meta sandbox knowing the campaign's number and two store numbers (the same token)."""
    numbers = {PHONE_NUMBER_ID: TOKEN, SHOPPING_ID: TOKEN, ONLINE_ID: TOKEN}
    with SandboxServer(host="127.0.0.1", port=0, numbers=numbers) as server:
        yield server


@pytest.fixture
def stores(wa, sandbox) -> dict:
    """Centro (no number of its own), Shopping and Online (each its number), and a sale helper."""
    org = wa["org"]

    def number(phone_number_id: str, display: str) -> WhatsappNumber:
        n = WhatsappNumber(
            organization=org,
            display_phone_number=display,
            phone_number_id=phone_number_id,
            graph_url=sandbox.url,
            messages_per_second=0,
        )
        n.set_access_token(TOKEN)
        n.save()
        return n

    shopping_number = number(SHOPPING_ID, "+5511940000001")
    online_number = number(ONLINE_ID, "+5511940000002")
    shopping = Store.objects.create(
        organization=org, erp_code="002", name="Shopping", whatsapp_number=shopping_number
    )
    online = Store.objects.create(
        organization=org, erp_code="003", name="Online", whatsapp_number=online_number
    )
    sequence = iter(range(1, 10_000))

    def sale(customer: Customer, store: Store, days_ago: int) -> Sale:
        return Sale.objects.create(
            organization=org,
            store=store,
            customer=customer,
            erp_id=f"S{next(sequence)}",
            total=Decimal("99.90"),
            sold_at=timezone.now() - timedelta(days=days_ago),
        )

    return {
        "centro": wa["store"],
        "shopping": shopping,
        "online": online,
        "shopping_number": shopping_number,
        "online_number": online_number,
        "sale": sale,
    }


def _sent_from(sandbox: SandboxServer) -> dict[str, str]:
    """Recipient digits -> the phone_number_id Meta received the message on."""
    return {m["to"]: m["phone_number_id"] for m in sandbox.messages()}


def _digits(customer: Customer) -> str:
    return customer.phone.lstrip("+")


def test_each_message_goes_from_the_store_of_the_customer_s_latest_sale(wa, stores, sandbox, run_jobs):
    moved, centro_only, never_bought, online_only = wa["customers"](4)
    stores["sale"](moved, stores["online"], days_ago=30)
    stores["sale"](moved, stores["shopping"], days_ago=2)  # the latest: Shopping
    stores["sale"](centro_only, stores["centro"], days_ago=1)  # Centro has no number of its own
    stores["sale"](online_only, stores["online"], days_ago=5)
    campaign = lifecycle.campaign_start(campaign=wa["campaign"](sender=Sender.STORE))
    run_jobs()
    campaign.refresh_from_db()
    assert campaign.status == Campaign.Status.SENT
    assert _sent_from(sandbox) == {
        _digits(moved): SHOPPING_ID,
        _digits(centro_only): PHONE_NUMBER_ID,  # the store has no number: the campaign's
        _digits(never_bought): PHONE_NUMBER_ID,  # no sale: the campaign's
        _digits(online_only): ONLINE_ID,
    }
    stored = dict(
        WhatsappMessage.objects.filter(campaign=campaign).values_list("customer_id", "whatsapp_number_id")
    )
    assert stored == {
        moved.pk: stores["shopping_number"].pk,
        centro_only.pk: wa["number"].pk,
        never_bought.pk: wa["number"].pk,
        online_only.pk: stores["online_number"].pk,
    }


def test_the_campaign_sender_ignores_the_stores(wa, stores, sandbox, run_jobs):
    people = wa["customers"](3)
    for person in people:
        stores["sale"](person, stores["shopping"], days_ago=1)
    lifecycle.campaign_start(campaign=wa["campaign"]())  # sender: the campaign (the default)
    run_jobs()
    assert set(_sent_from(sandbox).values()) == {PHONE_NUMBER_ID}


def test_a_batch_sends_each_number_s_messages_at_that_number_s_pace_and_never_sleeps_for_long(
    wa, stores, sandbox, settings
):
    settings.WHATSAPP_PACE_WINDOW = 2
    slow, busy = stores["shopping_number"], stores["online_number"]
    WhatsappNumber.objects.filter(pk__in=[slow.pk, busy.pk]).update(messages_per_second=1)
    people = wa["customers"](12)
    for person in people[:5]:
        stores["sale"](person, stores["shopping"], days_ago=1)
    for person in people[5:8]:
        stores["sale"](person, stores["online"], days_ago=1)
    campaign = lifecycle.campaign_start(campaign=wa["campaign"](sender=Sender.STORE))
    fanout.campaign_fanout(campaign_id=campaign.pk)
    assert set(WhatsappMessage.objects.filter(campaign=campaign).values_list("batch", flat=True)) == {0}
    ratelimit.reserve(f"wa:{busy.pk}", 100, 1)  # another campaign booked its next 100 seconds

    with pytest.raises(jobs.Defer):
        sending.whatsapp_send_batch(campaign_id=campaign.pk, batch=0)

    rows = WhatsappMessage.objects.filter(campaign=campaign)
    # The campaign's number (unpaced): all 4 sent. The slow one (1/s): the 3 slots of the next
    # 2 seconds, the other 2 back in the queue. The busy one: none, all back. No attempt spent.
    assert rows.filter(whatsapp_number=wa["number"], status=S.SENT).count() == 4
    assert sorted(rows.filter(whatsapp_number=slow).values_list("status", flat=True)) == sorted(
        [S.SENT] * 3 + [S.QUEUED] * 2
    )
    assert set(rows.filter(whatsapp_number=busy).values_list("status", flat=True)) == {S.QUEUED}
    assert set(rows.filter(status=S.QUEUED).values_list("attempts", flat=True)) == {0}
    assert sorted(_sent_from(sandbox).values()) == sorted([PHONE_NUMBER_ID] * 4 + [SHOPPING_ID] * 3)


def _paced_store_campaign(
    wa, stores, settings, *, rates: tuple[int, int, int], people: tuple[int, int, int], size: int = 8
):
    """A campaign from the customers' stores, batches of `size`: `people` of (no sale: the
    campaign's number, Shopping's, Online's), their pks interleaved, each number paced at its rate
    in `rates`. Returns (the campaign, number id -> its customers' ids in audience order)."""
    import random

    settings.WHATSAPP_BATCH_SIZE = size
    numbers = (wa["number"], stores["shopping_number"], stores["online_number"])
    for number, rate in zip(numbers, rates, strict=True):
        WhatsappNumber.objects.filter(pk=number.pk).update(messages_per_second=rate)
    kinds = [kind for kind, n in enumerate(people) for _ in range(n)]
    random.Random(7).shuffle(kinds)
    customers: dict[int, list[int]] = {n.pk: [] for n in numbers}
    for person, kind in zip(wa["customers"](len(kinds)), kinds, strict=True):
        if kind:
            stores["sale"](person, stores[("shopping", "online")[kind - 1]], days_ago=1)
        customers[numbers[kind].pk].append(person.pk)
    campaign = lifecycle.campaign_start(campaign=wa["campaign"](sender=Sender.STORE))
    fanout.campaign_fanout(campaign_id=campaign.pk, chunk=5)  # pages of 5: shares carried over
    return campaign, customers


def _composition(campaign: Campaign) -> dict[int, dict[int, int]]:
    """batch -> {number id: its messages in the batch}."""
    rows = (
        WhatsappMessage.objects.filter(campaign=campaign)
        .values_list("batch", "whatsapp_number_id")
        .annotate(n=Count("id"))
    )
    composition: dict[int, dict[int, int]] = {}
    for batch, number_id, n in rows:
        composition.setdefault(batch, {})[number_id] = n
    return composition


def test_a_batch_holds_each_number_s_messages_in_proportion_to_its_pace(
    wa, stores, sandbox, settings, run_jobs
):
    own, shopping, online = wa["number"].pk, stores["shopping_number"].pk, stores["online_number"].pk
    campaign, customers = _paced_store_campaign(wa, stores, settings, rates=(40, 20, 10), people=(16, 8, 5))

    # The batch size, 8, split in proportion to the paces 40, 20 and 10/s: 4, 2 and 1 (rounded down,
    # so a batch stays within the size): each number's share takes the same 0.1 s, so one job keeps
    # all three at their own pace.
    assert _composition(campaign) == {
        **{b: {own: 4, shopping: 2, online: 1} for b in range(4)},
        4: {online: 1},
    }
    assert all(sum(numbers.values()) <= 8 for numbers in _composition(campaign).values())
    share = {own: 4, shopping: 2, online: 1}
    batches = dict(WhatsappMessage.objects.filter(campaign=campaign).values_list("customer_id", "batch"))
    for number_id, ids in customers.items():  # each number's customers in audience order, share by share
        assert [batches[c] for c in ids] == [k // share[number_id] for k in range(len(ids))]

    run_jobs()
    assert Campaign.objects.get(pk=campaign.pk).status == Campaign.Status.SENT
    assert set(WhatsappMessage.objects.filter(campaign=campaign).values_list("status", flat=True)) == {S.SENT}
    assert sorted(_sent_from(sandbox).values()) == sorted(
        [PHONE_NUMBER_ID] * 16 + [SHOPPING_ID] * 8 + [ONLINE_ID] * 5
    )
    assert sandbox.stats()["accepted"] == 29 and sandbox.stats()["by_recipient_max"] == 1


def test_a_number_without_a_pace_gets_the_batch_size(wa, stores, settings):
    own, shopping, online = wa["number"].pk, stores["shopping_number"].pk, stores["online_number"].pk
    campaign, _ = _paced_store_campaign(wa, stores, settings, rates=(0, 20, 10), people=(10, 8, 5))
    assert _composition(campaign) == {
        0: {own: 8, shopping: 5, online: 2},  # unpaced: 8; the paced ones split 8 as 20:10 (5, 2)
        1: {own: 2, shopping: 3, online: 2},
        2: {online: 1},
    }


def test_a_number_meta_refuses_in_a_paced_campaign_holds_only_its_own_messages(
    wa, stores, sandbox, settings, run_jobs
):
    """Each of the campaign's batches holds some of the paused number's messages: every batch sends
    the others' and leaves those, which go once the number is resumed."""
    shopping = stores["shopping_number"].pk
    campaign, customers = _paced_store_campaign(wa, stores, settings, rates=(40, 20, 10), people=(16, 8, 5))
    batches = dict(WhatsappMessage.objects.filter(campaign=campaign).values_list("id", "batch"))
    for phone in Customer.objects.filter(pk__in=customers[shopping]).values_list("phone", flat=True):
        sandbox.add_rule(to=phone.lstrip("+"), code=131048)  # Meta: this number's quality
    run_jobs(settle=1)

    rows = WhatsappMessage.objects.filter(campaign=campaign)
    assert WhatsappNumber.objects.get(pk=shopping).paused_at is not None
    assert set(rows.filter(whatsapp_number_id=shopping).values_list("status", "attempts")) == {(S.QUEUED, 0)}
    assert set(rows.exclude(whatsapp_number_id=shopping).values_list("status", flat=True)) == {S.SENT}
    assert sorted(_sent_from(sandbox).values()) == sorted([PHONE_NUMBER_ID] * 16 + [ONLINE_ID] * 5)
    assert Campaign.objects.get(pk=campaign.pk).status == Campaign.Status.SENDING

    sandbox.clear_rules()
    whatsapp_numbers_resume(numbers=WhatsappNumber.objects.filter(pk=shopping))
    lifecycle.requeue_unfinished_batches(campaign_id=campaign.pk)
    run_jobs()
    assert Campaign.objects.get(pk=campaign.pk).status == Campaign.Status.SENT
    assert set(rows.values_list("status", flat=True)) == {S.SENT}
    assert dict(rows.values_list("id", "batch")) == batches  # the batches kept their shares
    assert sorted(_sent_from(sandbox).values()) == sorted(
        [PHONE_NUMBER_ID] * 16 + [SHOPPING_ID] * 8 + [ONLINE_ID] * 5
    )
    assert sandbox.stats()["by_recipient_max"] == 1


def test_a_batch_books_its_numbers_after_the_slots_another_job_holds(wa, stores, sandbox, settings):
    """Jobs that run side by side: the second books each number's share after the first's, and
    sends it all, instead of a slot each and a deferral."""
    campaign, _ = _paced_store_campaign(wa, stores, settings, rates=(16, 8, 4), people=(8, 4, 2), size=14)
    assert set(WhatsappMessage.objects.filter(campaign=campaign).values_list("batch", flat=True)) == {0}
    for number in (wa["number"], stores["shopping_number"], stores["online_number"]):
        rate = WhatsappNumber.objects.get(pk=number.pk).messages_per_second
        ratelimit.reserve(f"wa:{number.pk}", rate, rate)  # another batch holds each one's next second

    assert sending.whatsapp_send_batch(campaign_id=campaign.pk, batch=0)["sent"] == 14  # no Defer
    assert set(WhatsappMessage.objects.filter(campaign=campaign).values_list("status", flat=True)) == {S.SENT}
    assert sandbox.stats()["accepted"] == 14


def test_a_graph_url_the_outbound_guard_refuses_pauses_its_number_and_strands_no_message(
    wa, stores, sandbox, settings, run_jobs, english
):
    """Nothing was sent: the number waits for its URL to be fixed, its messages QUEUED (not SENDING
    until the in-flight reconciliation); the other numbers go on."""
    from integrations import outbound

    settings.ALLOW_PRIVATE_OUTBOUND_URLS = False
    outbound.trust_origin(sandbox.url)  # the sandbox's 127.0.0.1, as `demo --graph-url` trusts it
    shopping = stores["shopping_number"]
    WhatsappNumber.objects.filter(pk=shopping.pk).update(
        graph_url=sandbox.url.replace("127.0.0.1", "localhost")
    )
    people = wa["customers"](4)
    for person in people[:2]:
        stores["sale"](person, stores["shopping"], days_ago=1)
    campaign = lifecycle.campaign_start(campaign=wa["campaign"](sender=Sender.STORE))
    run_jobs(settle=1)

    number = WhatsappNumber.objects.get(pk=shopping.pk)
    assert number.paused_at is not None and "not allowed" in number.paused_reason
    rows = WhatsappMessage.objects.filter(campaign=campaign)
    assert set(rows.filter(whatsapp_number=number).values_list("status", "attempts")) == {(S.QUEUED, 0)}
    assert rows.exclude(whatsapp_number=number).filter(status=S.SENT).count() == 2
    assert set(_sent_from(sandbox).values()) == {PHONE_NUMBER_ID}

    WhatsappNumber.objects.filter(pk=number.pk).update(graph_url=sandbox.url)  # the operator's fix
    whatsapp_numbers_resume(numbers=WhatsappNumber.objects.filter(pk=number.pk))
    lifecycle.requeue_unfinished_batches(campaign_id=campaign.pk)
    run_jobs()
    assert set(rows.values_list("status", flat=True)) == {S.SENT}
    assert sandbox.stats()["by_recipient_max"] == 1


def test_a_number_meta_refuses_pauses_only_its_own_messages_until_resumed(wa, stores, sandbox, run_jobs):
    people = wa["customers"](6)
    shopping_people = people[:3]
    for person in shopping_people:
        stores["sale"](person, stores["shopping"], days_ago=1)
        # Meta answers every send from this number with "spam rate limit hit" (the number's quality).
        sandbox.add_rule(to=_digits(person), code=131048)
    campaign = lifecycle.campaign_start(campaign=wa["campaign"](sender=Sender.STORE))
    run_jobs(settle=1)

    number = WhatsappNumber.objects.get(pk=stores["shopping_number"].pk)
    assert number.paused_at is not None and "131048" in number.paused_reason
    org = Organization.objects.get(pk=wa["org"].pk)
    assert org.whatsapp_paused_at is None  # the other numbers go on
    rows = WhatsappMessage.objects.filter(campaign=campaign)
    assert set(rows.filter(whatsapp_number=number).values_list("status", "attempts")) == {(S.QUEUED, 0)}
    assert rows.exclude(whatsapp_number=number).filter(status=S.SENT).count() == 3
    assert Campaign.objects.get(pk=campaign.pk).status == Campaign.Status.SENDING
    assert set(_sent_from(sandbox).values()) == {PHONE_NUMBER_ID}
    # While paused, its batch claims nothing and waits (no attempt spent, nothing sent).
    batch = rows.filter(whatsapp_number=number).values_list("batch", flat=True).first()
    with pytest.raises(jobs.Defer, match="131048"):
        sending.whatsapp_send_batch(campaign_id=campaign.pk, batch=batch)
    assert set(rows.filter(whatsapp_number=number).values_list("status", "attempts")) == {(S.QUEUED, 0)}
    # The campaign's page says which number holds its messages, and why.
    waiting = selectors.sending_paused(campaign=Campaign.objects.get(pk=campaign.pk))
    assert waiting.startswith(f"{number.display_phone_number}: ") and "131048" in waiting

    sandbox.clear_rules()  # the operator fixed the cause, then resumes the number
    assert whatsapp_numbers_resume(numbers=WhatsappNumber.objects.filter(pk=number.pk)) == 1
    lifecycle.requeue_unfinished_batches(campaign_id=campaign.pk)
    run_jobs()
    assert Campaign.objects.get(pk=campaign.pk).status == Campaign.Status.SENT
    assert set(rows.values_list("status", flat=True)) == {S.SENT}
    assert selectors.sending_paused(campaign=Campaign.objects.get(pk=campaign.pk)) == ""
    assert sorted(_sent_from(sandbox).values()) == sorted([PHONE_NUMBER_ID] * 3 + [SHOPPING_ID] * 3)
    assert sandbox.stats()["by_recipient_max"] == 1


def test_a_store_cannot_send_from_another_organization_s_number(wa, stores, english):
    other = Organization.objects.create(name="Outra", slug="outra")
    store = Store(organization=other, erp_code="X1", name="X", whatsapp_number=stores["online_number"])
    with pytest.raises(ValidationError, match="another organization"):
        store.full_clean()


def test_demo_campaign_sends_from_the_demo_stores_numbers(transactional_db, run_jobs, english):
    from project.demo.integrations import DEMO_ACCESS_TOKEN, DEMO_PHONE_NUMBER_IDS

    numbers = dict.fromkeys(DEMO_PHONE_NUMBER_IDS, DEMO_ACCESS_TOKEN)
    with SandboxServer(numbers=numbers) as sandbox:
        call_command("demo", customers=6, graph_url=sandbox.url, stdout=StringIO())
        out = StringIO()
        call_command("demo_campaign", "--channel", "whatsapp", "--sender", "store", stdout=out)
        campaign = Campaign.objects.get(pk=int(out.getvalue().strip()))
        assert campaign.sender == Sender.STORE
        lifecycle.campaign_start(campaign=campaign)
        run_jobs()
        sent = _sent_from(sandbox)
    assert len(sent) == 6
    expected = {
        c.phone.lstrip("+"): c.sales.get().store.whatsapp_number.phone_number_id
        for c in Customer.objects.filter(organization=campaign.organization)
    }
    assert sent == expected and set(sent.values()) == set(DEMO_PHONE_NUMBER_IDS)
    out = StringIO()
    call_command("demo_campaign", "--channel", "whatsapp", stdout=out)
    assert Campaign.objects.get(pk=int(out.getvalue().strip())).sender == Sender.CAMPAIGN
