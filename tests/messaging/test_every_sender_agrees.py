"""Every sender applies the same messaging.decisions outcome to the same provider answer: a campaign's
WhatsApp batch, a campaign's email chunk, a post-sale survey by WhatsApp and a survey by email.

For each drawn answer, each sender's own writing is read back as the verdict it applied (sent, outcome
unknown, released with the attempt given back, retried, failed) and compared with the decision and
with the other sender of the same channel. The campaign senders are read from their pure plans; the
surveys from their rows in PostgreSQL after the survey's own code recorded the answer."""

from __future__ import annotations

import contextlib
from collections.abc import Container
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from django.utils import timezone
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from campaigns.email import sending as email_sending
from campaigns.email.sending import chunk_classify
from campaigns.models import EmailMessage
from campaigns.whatsapp import plan as whatsapp_plan
from campaigns.whatsapp.plan import Outcome, batch_classify
from crm.jobs import Defer
from crm.models import Customer, Organization, Sale, Store
from integrations.models import WhatsappNumber
from integrations.whatsapp.client import SendResult
from messaging import decisions
from messaging.decisions import Verdict
from messaging.email_transport import Delivery
from messaging.models import EmailSuppression
from surveys import sending, services
from surveys.models import Survey
from tests.messaging.test_decisions import email_answers, meta_answers

S = Survey.Status
UNKNOWN = "outcome unknown"  # how both apps' rows begin their reason
EXAMPLES = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

# Each sender has its own attempts (a campaign's WhatsApp 2, email 3, a survey 3): an answer is drawn
# with "this is the sender's last attempt" or not, and each sender is at that point of its own.
LAST = st.booleans()


def _attempts(last: bool, max_attempts: int) -> int:
    return max_attempts if last else 1


class World:
    """One organization with a store, a number, a customer and one survey, put back before each answer."""

    def __init__(self) -> None:
        self.org = Organization.objects.create(name="Loja", slug="loja-agree", survey_channel="whatsapp")
        self.store = Store.objects.create(organization=self.org, erp_code="001", name="Centro")
        self.customer = Customer.objects.create(
            organization=self.org,
            name="Ana Silva",
            email="ana@example.com.br",
            phone="+5511999990001",
            marketing_consent=True,
        )
        self.number = WhatsappNumber(
            organization=self.org, display_phone_number="+5511940000000", phone_number_id="1"
        )
        self.number.set_access_token("token")
        self.number.save()
        sale = Sale.objects.create(
            organization=self.org,
            store=self.store,
            customer=self.customer,
            erp_id="V1",
            total=Decimal("10"),
            sold_at=timezone.now(),
        )
        self.survey_id = Survey.objects.get(sale=sale).pk

    def sending(self, attempts: int) -> Survey:
        """The survey claimed for its `attempts`-th try; the organization, number and customer unpaused."""
        Organization.objects.filter(pk=self.org.pk).update(
            whatsapp_paused_at=None, whatsapp_paused_reason="", email_paused_at=None, email_paused_reason=""
        )
        WhatsappNumber.objects.filter(pk=self.number.pk).update(paused_at=None, paused_reason="")
        Customer.objects.filter(pk=self.customer.pk).update(whatsapp_opted_out_at=None)
        EmailSuppression.objects.all().delete()
        Survey.objects.filter(pk=self.survey_id).update(
            status=S.SENDING, attempts=attempts, reason="", sent_at=None, provider_reference=""
        )
        return Survey.objects.select_related("organization", "customer", "store").get(pk=self.survey_id)

    def applied(self, attempts: int) -> Verdict:
        """The verdict the survey's row shows it applied."""
        survey = Survey.objects.get(pk=self.survey_id)
        if survey.status == S.SENT:
            return Verdict.SENT
        if survey.status == S.FAILED:
            return Verdict.UNKNOWN if survey.reason.startswith(UNKNOWN) else Verdict.FAIL
        assert survey.status == S.SCHEDULED, survey.status
        return Verdict.RELEASE if survey.attempts == attempts - 1 else Verdict.RETRY


@pytest.fixture
def world(db) -> World:
    return World()


def _storable(*texts: str | None) -> None:
    """PostgreSQL text holds no NUL byte: an answer carrying one is not drawn here (see the report)."""
    assume(not any("\x00" in (text or "") for text in texts))


def _record(call) -> None:
    """A sender that waits says so by raising; what it wrote is what is compared."""
    with contextlib.suppress(Defer, services.SurveyRetry):
        call()


def _campaign_whatsapp(result: SendResult, attempts: int) -> Verdict:
    outcome = Outcome(
        message_id=1, customer_id=2, number_id=3, attempts=attempts, phone="+5511999990001", result=result
    )
    plan = batch_classify([outcome], skipped={}, prices={})
    groups: dict[Verdict, Container[int]] = {
        Verdict.SENT: plan.sent,
        Verdict.UNKNOWN: plan.unknown,
        Verdict.RELEASE: plan.release,
        Verdict.RETRY: plan.retry,
        Verdict.FAIL: plan.failed,
    }
    [verdict] = [v for v, ids in groups.items() if 1 in ids]  # in one group only
    return verdict


def _campaign_email(outcome: Delivery, attempts: int) -> Verdict:
    message = EmailMessage(pk=1, email="ana@example.com.br", attempts=attempts)
    plan = chunk_classify([message], [outcome], now=datetime(2026, 1, 1, tzinfo=UTC))
    if plan.sent:
        return Verdict.SENT
    if plan.release:
        return Verdict.RELEASE
    if plan.retry:
        return Verdict.RETRY
    if plan.failed:  # a message whose hand-over broke: failed with "outcome unknown", never resent
        assert plan.failed[0].error_reason.startswith(UNKNOWN)
        return Verdict.UNKNOWN
    assert plan.bounced or plan.blocked
    return Verdict.FAIL


@EXAMPLES
@given(result=meta_answers(), last=LAST)
def test_both_whatsapp_senders_apply_the_decision_to_every_meta_answer(
    world: World, result: SendResult, last: bool
) -> None:
    if result.error is not None:
        _storable(result.error.message, result.error.details)
    attempts = _attempts(last, services.ATTEMPTS)
    decision = decisions.whatsapp(result, attempts=attempts, max_attempts=services.ATTEMPTS)
    campaign_attempts = _attempts(last, whatsapp_plan.ATTEMPTS)
    same = decisions.whatsapp(result, attempts=campaign_attempts, max_attempts=whatsapp_plan.ATTEMPTS)
    assert same == decision  # the decision depends on the answer and on whether attempts are left
    survey = world.sending(attempts)

    _record(lambda: sending._whatsapp_outcome(survey, world.number, result))

    assert world.applied(attempts) is decision.verdict
    assert _campaign_whatsapp(result, campaign_attempts) is decision.verdict
    assert bool(Organization.objects.get(pk=world.org.pk).whatsapp_paused_at) == bool(
        decision.pause_organization
    )
    assert bool(WhatsappNumber.objects.get(pk=world.number.pk).paused_at) == bool(decision.pause_number)
    opted_out = Customer.objects.get(pk=world.customer.pk).whatsapp_opted_out_at is not None
    assert opted_out == decision.opt_out


@EXAMPLES
@given(outcome=email_answers(), last=LAST)
def test_both_email_senders_apply_the_decision_to_every_server_answer(
    world: World, outcome: Delivery, last: bool
) -> None:
    _storable(outcome.unknown, outcome.transient, outcome.failure.message if outcome.failure else "")
    attempts = _attempts(last, services.ATTEMPTS)
    decision = decisions.email(outcome, attempts=attempts, max_attempts=services.ATTEMPTS)
    campaign_attempts = _attempts(last, email_sending.ATTEMPTS)
    same = decisions.email(outcome, attempts=campaign_attempts, max_attempts=email_sending.ATTEMPTS)
    assert same == decision
    survey = world.sending(attempts)

    _record(lambda: sending._email_outcome(survey, outcome))

    assert world.applied(attempts) is decision.verdict
    assert _campaign_email(outcome, campaign_attempts) is decision.verdict
    hard_bounce = decision.verdict is Verdict.FAIL and decision.bounce == "hard"
    assert EmailSuppression.objects.exists() == hard_bounce
    paused = Organization.objects.get(pk=world.org.pk).email_paused_at is not None
    assert paused == bool(decision.pause_organization)
