"""Email surveys end to end: dispatch, real burst workers, the loopback SMTP sandbox, PostgreSQL, Redis."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from crm import cron, jobs, queues, ratelimit
from crm.models import Organization
from integrations.models import EmailSettings
from messaging import pacing
from messaging.models import EmailSuppression
from project.sandboxes.smtp import SmtpSandbox, Stage
from surveys import links, sending, services
from surveys.models import OUTCOME_UNKNOWN, Survey
from tests.surveys.conftest import SENDER, Shop, reload

S = Survey.Status
PUBLIC_URL = "https://crm.lojateste.com.br"
USER_UNKNOWN = "5.1.1 <ana@example.com.br>: Recipient address rejected: User unknown"


@pytest.fixture(autouse=True)
def _public_url(settings) -> None:
    settings.PUBLIC_URL = PUBLIC_URL


def _send_due(run_jobs) -> int:
    enqueued = services.surveys_dispatch()
    run_jobs([queues.POST_SALE_SURVEY], settle=1)
    return enqueued


def test_a_due_survey_is_emailed_once_with_its_https_link(email_shop: Shop, smtp: SmtpSandbox, run_jobs):
    shop = email_shop
    survey = shop.due_survey(shop.ana, store=shop.shopping)
    later = Survey.objects.get(sale=shop.sale(shop.bruno))  # due in 3 days

    assert _send_due(run_jobs) == 1

    [received] = smtp.messages()
    assert received["rcpt_tos"] == ["ana@example.com.br"]
    assert received["mail_from"] == SENDER
    assert received["headers"]["From"] == f"Loja Teste <{SENDER}>"
    assert received["subject"] == "Ana, como foi sua compra na Loja Teste?"
    urls = re.findall(r"https://\S+", received["text"])
    assert urls == [f"{PUBLIC_URL}/{links.survey_path(reload(survey))}"]
    signed = urls[0].removeprefix(f"{PUBLIC_URL}/s/")
    assert links.survey_for(signed) == survey
    assert f'href="{urls[0]}"' in received["html"]
    assert "De 0 a 10" in received["text"] and "Shopping" in received["text"]
    survey = reload(survey)
    assert survey.status == S.SENT and survey.sent_at is not None
    assert survey.attempts == 1 and survey.provider_reference.startswith("250")
    assert reload(later).status == S.SCHEDULED


def test_running_dispatch_and_send_twice_sends_once(email_shop: Shop, smtp: SmtpSandbox, run_jobs):
    survey = email_shop.due_survey(email_shop.ana)
    # A duplicate job (a second scheduler, a recovery racing the dispatch) with another id.
    jobs.enqueue("surveys.tasks.survey_send", queue=queues.POST_SALE_SURVEY, kwargs={"survey_id": survey.pk})
    _send_due(run_jobs)
    _send_due(run_jobs)

    assert len(smtp.messages()) == 1
    assert sending.survey_send(survey_id=survey.pk) == "nothing to do"
    assert len(smtp.messages()) == 1
    assert reload(survey).attempts == 1


def test_the_cron_entry_sends_due_surveys_through_the_maintenance_queue(
    email_shop: Shop, smtp: SmtpSandbox, run_jobs
):
    email_shop.due_survey(email_shop.ana)

    cron.cron_fire("surveys-dispatch")
    run_jobs([queues.MAINTENANCE, queues.POST_SALE_SURVEY], settle=1)

    assert len(smtp.messages(to="ana@example.com.br")) == 1


def test_a_redis_flush_loses_no_survey(email_shop: Shop, smtp: SmtpSandbox, run_jobs, redis_db):
    surveys = [email_shop.due_survey(c) for c in (email_shop.ana, email_shop.bruno)]
    assert services.surveys_dispatch() == 2
    redis_db.flushdb()  # Redis restarted without persistence: the queued jobs are gone

    assert _send_due(run_jobs) == 2

    assert sorted(m["rcpt_tos"][0] for m in smtp.messages()) == ["ana@example.com.br", "bruno@example.com.br"]
    assert {reload(s).status for s in surveys} == {S.SENT}


def test_an_opted_out_customer_is_skipped_with_the_reason(email_shop: Shop, smtp: SmtpSandbox, run_jobs):
    shop = email_shop
    shop.ana.email_opted_out_at = timezone.now()
    shop.ana.save()
    no_consent = shop.customer("Carla", "carla@example.com.br", marketing_consent=False)
    no_address = shop.customer("Davi", "")
    surveys = {c.name: shop.due_survey(c) for c in (shop.ana, no_consent, no_address)}

    _send_due(run_jobs)

    assert smtp.messages() == []
    reasons = {name: (reload(s).status, reload(s).reason) for name, s in surveys.items()}
    assert reasons == {
        "Ana Silva": (S.SKIPPED, "customer opted out of email"),
        "Carla": (S.SKIPPED, "customer has no marketing consent"),
        "Davi": (S.SKIPPED, "customer has no email address"),
    }


def test_a_customer_surveyed_within_the_cool_down_is_skipped(email_shop: Shop, smtp: SmtpSandbox, run_jobs):
    shop = email_shop
    earlier = shop.due_survey(shop.ana)
    Survey.objects.filter(pk=earlier.pk).update(status=S.SENT, sent_at=timezone.now() - timedelta(days=10))
    long_ago = shop.due_survey(shop.bruno)
    Survey.objects.filter(pk=long_ago.pk).update(
        status=S.ANSWERED, sent_at=timezone.now() - timedelta(days=91)
    )
    ana_again = shop.due_survey(shop.ana)
    bruno_again = shop.due_survey(shop.bruno)

    _send_due(run_jobs)

    ana_again = reload(ana_again)
    assert ana_again.status == S.SKIPPED
    assert "within the 90-day cool-down" in ana_again.reason
    assert reload(bruno_again).status == S.SENT
    assert [m["rcpt_tos"] for m in smtp.messages()] == [["bruno@example.com.br"]]


def test_two_sales_due_together_survey_the_customer_once(email_shop: Shop, smtp: SmtpSandbox, run_jobs):
    first = email_shop.due_survey(email_shop.ana)
    second = email_shop.due_survey(email_shop.ana)

    _send_due(run_jobs)

    assert len(smtp.messages()) == 1
    statuses = sorted([reload(first).status, reload(second).status])
    assert statuses == [S.SENT, S.SKIPPED]


def test_a_hard_bounce_fails_the_survey_suppresses_the_address_and_never_resends(
    email_shop: Shop, smtp: SmtpSandbox, run_jobs
):
    smtp.reply_for("ana@example.com.br", 550, USER_UNKNOWN)
    survey = email_shop.due_survey(email_shop.ana)

    _send_due(run_jobs)

    survey = reload(survey)
    assert survey.status == S.FAILED
    assert survey.reason.startswith("hard bounce: 550 5.1.1") and survey.sent_at is None
    assert EmailSuppression.objects.filter(organization=email_shop.org, email="ana@example.com.br").exists()
    assert smtp.messages() == []
    assert services.surveys_dispatch() == 0
    assert sending.survey_send(survey_id=survey.pk) == "nothing to do"


def test_a_policy_block_fails_the_survey_and_keeps_the_address(email_shop: Shop, smtp: SmtpSandbox, run_jobs):
    smtp.reply_for("ana@example.com.br", 550, "5.7.1 Service unavailable; client host blocked using Spamhaus")
    survey = email_shop.due_survey(email_shop.ana)

    _send_due(run_jobs)

    survey = reload(survey)
    assert (survey.status, survey.attempts) == (S.FAILED, 1)
    assert survey.reason.startswith("blocked: 550 5.7.1") and "Spamhaus" in survey.reason
    assert not EmailSuppression.objects.exists()
    assert smtp.messages() == []


def test_a_soft_bounce_goes_back_to_scheduled_and_rq_retries_it(
    email_shop: Shop, smtp: SmtpSandbox, run_jobs
):
    smtp.reply_for("ana@example.com.br", 452, "4.2.2 Mailbox full", times=1)
    survey = email_shop.due_survey(email_shop.ana)

    _send_due(run_jobs)

    survey = reload(survey)
    assert (survey.status, survey.attempts) == (S.SCHEDULED, 1)
    assert survey.reason.startswith("soft bounce: 452 4.2.2")
    job = jobs.fetch_job(f"survey-{survey.pk}")
    assert job is not None and job.get_status() == "scheduled"  # RQ's retry, 60 s later
    assert services.surveys_dispatch() == 0  # the retry is pending: not enqueued twice
    # the retry, run now rather than in 60 s
    assert sending.survey_send(survey_id=survey.pk) == "sent"
    assert (reload(survey).status, reload(survey).attempts) == (S.SENT, 2)
    assert len(smtp.messages()) == 1


def test_a_soft_bounce_on_the_last_attempt_fails_the_survey(email_shop: Shop, smtp: SmtpSandbox):
    smtp.reply_for("ana@example.com.br", 452, "4.2.2 Mailbox full")
    survey = email_shop.due_survey(email_shop.ana)
    Survey.objects.filter(pk=survey.pk).update(attempts=2)

    assert sending.survey_send(survey_id=survey.pk) == "failed"

    survey = reload(survey)
    assert (survey.status, survey.attempts) == (S.FAILED, 3)
    assert survey.reason.startswith("soft bounce: 452")


@pytest.mark.parametrize(
    ("code", "message", "at"),
    [(535, "5.7.8 Authentication credentials invalid", "AUTH"), (421, "4.7.0 Try again later", "MAIL")],
)
def test_a_sender_failure_pauses_the_organization_and_keeps_the_survey(
    email_shop: Shop, smtp: SmtpSandbox, run_jobs, code: int, message: str, at: Stage
):
    EmailSettings.objects.filter(organization=email_shop.org).update(username="loja")
    smtp.reply_for_all(code, message, at=at)
    survey = email_shop.due_survey(email_shop.ana)

    _send_due(run_jobs)

    org = Organization.objects.get(pk=email_shop.org.pk)
    assert org.email_paused_at is not None and str(code) in org.email_paused_reason
    survey = reload(survey)
    assert (survey.status, survey.attempts, survey.sent_at) == (S.SCHEDULED, 0, None)
    assert smtp.messages() == []
    job = jobs.fetch_job(f"survey-{survey.pk}")
    assert job is not None and job.get_status() == "scheduled"  # deferred, no attempt spent
    assert services.surveys_dispatch() == 0  # a paused organization's surveys wait in the table

    # The operator fixes the settings and clears the pause: the survey goes out.
    smtp.reset()
    Organization.objects.filter(pk=org.pk).update(email_paused_at=None, email_paused_reason="")
    assert sending.survey_send(survey_id=survey.pk) == "sent"
    assert len(smtp.messages()) == 1


def test_no_email_settings_pauses_the_organization_email(shop: Shop, run_jobs):
    survey = shop.due_survey(shop.ana)

    _send_due(run_jobs)

    assert Organization.objects.get(pk=shop.org.pk).email_paused_reason == "no email settings"
    assert reload(survey).status == S.SCHEDULED


def test_a_connection_lost_after_the_hand_over_fails_the_survey_and_never_resends(
    email_shop: Shop, smtp: SmtpSandbox, run_jobs
):
    smtp.hang_up_after_data("ana@example.com.br")
    survey = email_shop.due_survey(email_shop.ana)

    _send_due(run_jobs)
    _send_due(run_jobs)

    survey = reload(survey)
    assert survey.status == S.FAILED and survey.reason.startswith(OUTCOME_UNKNOWN)
    assert len(smtp.messages()) == 1  # the server kept it; we never send it again


def test_a_survey_stuck_in_sending_is_settled_as_failed_not_resent(
    email_shop: Shop, smtp: SmtpSandbox, run_jobs
):
    survey = email_shop.due_survey(email_shop.ana)
    Survey.objects.filter(pk=survey.pk).update(
        status=S.SENDING, attempts=1, sending_at=timezone.now() - timedelta(minutes=20)
    )

    _send_due(run_jobs)

    assert (reload(survey).status, reload(survey).reason) == (S.FAILED, OUTCOME_UNKNOWN)
    assert smtp.messages() == []


def test_surveys_turned_off_cancel_the_scheduled_ones(email_shop: Shop, smtp: SmtpSandbox, run_jobs):
    survey = email_shop.due_survey(email_shop.ana)
    email_shop.use_channel("off")

    _send_due(run_jobs)

    assert reload(survey).status == S.CANCELLED
    assert smtp.messages() == []


def test_the_admin_send_now_action_sends_a_scheduled_survey_today(
    email_shop: Shop, smtp: SmtpSandbox, run_jobs, admin_client
):
    survey = Survey.objects.get(sale=email_shop.sale(email_shop.ana))  # due in 3 days
    answered = email_shop.due_survey(email_shop.bruno)
    Survey.objects.filter(pk=answered.pk).update(status=S.ANSWERED)

    response = admin_client.post(
        "/admin/surveys/survey/",
        {"action": "send_now", "_selected_action": [survey.pk, answered.pk]},
    )

    assert response.status_code == 302
    assert reload(survey).due_at <= timezone.now()
    run_jobs([queues.POST_SALE_SURVEY], settle=1)
    assert reload(survey).status == S.SENT
    assert [m["rcpt_tos"] for m in smtp.messages()] == [["ana@example.com.br"]]


def test_surveys_share_the_organization_s_email_rate_with_campaigns(
    email_shop: Shop, smtp: SmtpSandbox, run_jobs
):
    EmailSettings.objects.filter(organization=email_shop.org).update(messages_per_minute=120)  # 2/s
    surveys = [email_shop.due_survey(c) for c in (email_shop.ana, email_shop.bruno)]

    _send_due(run_jobs)

    assert {reload(s).status for s in surveys} == {S.SENT}
    first, second = sorted(m["received_at"] for m in smtp.messages())
    assert (second - first).total_seconds() >= 0.3  # a slot every 0.5 s (less arrival jitter)
    assert jobs.get_connection().exists(f"crm:pace:email:{email_shop.org.pk}")


def test_a_rate_slot_far_ahead_defers_the_survey_without_spending_an_attempt(
    email_shop: Shop, smtp: SmtpSandbox, run_jobs
):
    EmailSettings.objects.filter(organization=email_shop.org).update(messages_per_minute=60)
    ratelimit.reserve(pacing.email_key(email_shop.org.pk), 120, 1.0)  # a campaign booked the next 2 minutes
    survey = email_shop.due_survey(email_shop.ana)

    _send_due(run_jobs)

    assert (reload(survey).status, reload(survey).attempts) == (S.SCHEDULED, 0)
    job = jobs.fetch_job(f"survey-{survey.pk}")
    assert job is not None and job.get_status() == "scheduled"
    assert smtp.messages() == []


def test_an_organization_on_an_esp_surveys_through_its_api(shop: Shop, run_jobs, settings):
    from project.sandboxes.esp import PostmarkSandbox

    settings.EMAIL_RETRY_BACKOFF = 0.5
    token = "pm-survey-token-0123456789"
    with PostmarkSandbox(server_tokens=[token]) as postmark:
        email_settings = EmailSettings(
            organization=shop.org,
            provider=EmailSettings.Provider.POSTMARK,
            esp_api_url=postmark.url,
            sender_name="Loja Teste",
            sender_email=SENDER,
            messages_per_minute=0,
        )
        email_settings.set_esp_api_key(token)
        email_settings.save()
        survey = shop.due_survey(shop.ana)
        postmark.fail(503, times=1)  # the ESP is briefly down: released, deferred, no attempt spent
        _send_due(run_jobs)
        assert [r["status"] for r in postmark.requests()] == [503, 200]
        [received] = postmark.messages()
    survey = reload(survey)
    assert survey.status == S.SENT and survey.attempts == 1
    assert received["To"].endswith("<ana@example.com.br>")
    assert f"{PUBLIC_URL}/{links.survey_path(survey)}" in received["TextBody"]
    assert "MessageStream" not in received  # one-off mail: the transactional stream, not broadcast
