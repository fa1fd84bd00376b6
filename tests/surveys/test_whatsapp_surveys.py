"""WhatsApp surveys end to end against the Meta sandbox: real PostgreSQL, Redis, workers and HTTP."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from crm import jobs, queues
from crm.models import Organization
from integrations.models import WhatsappNumber
from project.sandboxes.whatsapp import SandboxServer
from surveys import links, sending, services
from surveys.models import Survey
from tests.conftest import wait_for
from tests.surveys.conftest import ORG_NUMBER_ID, PHONE_NUMBER_ID, Shop, reload

S = Survey.Status


def _send_due(run_jobs) -> int:
    enqueued = services.surveys_dispatch()
    run_jobs([queues.POST_SALE_SURVEY], settle=1)
    return enqueued


def _components(sent: dict) -> dict[str, dict]:
    return {c["type"] + c.get("index", ""): c for c in sent["template"]["components"]}


def test_a_due_survey_goes_out_as_the_template_with_the_survey_link_from_the_store_number(
    whatsapp_shop: Shop, meta: SandboxServer, run_jobs
):
    shop = whatsapp_shop
    survey = shop.due_survey(shop.ana, store=shop.shopping)
    assert survey.channel == Survey.Channel.WHATSAPP

    assert _send_due(run_jobs) == 1

    [sent] = meta.messages()
    assert sent["to"] == "5511999990001"
    assert sent["phone_number_id"] == PHONE_NUMBER_ID  # the Shopping store's own number
    assert sent["template"]["name"] == "pesquisa_pos_venda"
    assert sent["template"]["language"] == {"code": "pt_BR"}
    components = _components(sent)
    assert components["body"]["parameters"] == [{"type": "text", "text": "Ana"}]
    [button] = components["button0"]["parameters"]
    assert button["text"] == links.survey_path(survey)
    assert button["text"].startswith("s/")
    assert links.survey_for(button["text"].removeprefix("s/")) == survey
    survey = reload(survey)
    assert survey.status == S.SENT and survey.provider_reference == sent["wamid"]
    # again: nothing more is sent
    assert _send_due(run_jobs) == 0
    assert sending.survey_send(survey_id=survey.pk) == "nothing to do"
    assert len(meta.messages()) == 1


def test_a_store_without_a_number_uses_the_organization_s_first_number(
    whatsapp_shop: Shop, meta: SandboxServer, run_jobs
):
    whatsapp_shop.due_survey(whatsapp_shop.bruno, store=whatsapp_shop.centro)

    _send_due(run_jobs)

    [sent] = meta.messages()
    assert (sent["to"], sent["phone_number_id"]) == ("5521999990002", ORG_NUMBER_ID)


def test_names_as_typed_get_the_same_first_name_as_campaigns_and_an_empty_one_the_fallback(
    whatsapp_shop: Shop, meta: SandboxServer, run_jobs
):
    shop = whatsapp_shop
    erp = shop.customer("\tJOÃO\r\nDA SILVA", "", "+5511999990003")
    blank = shop.customer(" \u200b\t", "", "+5511999990004")
    surveys = [shop.due_survey(c) for c in (erp, blank)]

    _send_due(run_jobs)

    assert [reload(s).status for s in surveys] == [S.SENT, S.SENT]
    first = {m["to"]: _components(m)["body"]["parameters"][0]["text"] for m in meta.messages()}
    assert first == {"5511999990003": "João", "5511999990004": services.FIRST_NAME_FALLBACK}


def test_opted_out_and_phoneless_customers_are_skipped(whatsapp_shop: Shop, meta: SandboxServer, run_jobs):
    shop = whatsapp_shop
    shop.ana.whatsapp_opted_out_at = timezone.now()
    shop.ana.save()
    phoneless = shop.customer("Carla", "carla@example.com.br", "")
    surveys = [shop.due_survey(c) for c in (shop.ana, phoneless)]

    _send_due(run_jobs)

    assert meta.messages() == []
    assert [(reload(s).status, reload(s).reason) for s in surveys] == [
        (S.SKIPPED, "customer opted out of WhatsApp"),
        (S.SKIPPED, "customer has no phone number"),
    ]


def test_the_cool_down_counts_surveys_of_either_channel(whatsapp_shop: Shop, meta: SandboxServer, run_jobs):
    shop = whatsapp_shop
    by_email = shop.due_survey(shop.ana)
    Survey.objects.filter(pk=by_email.pk).update(
        channel=Survey.Channel.EMAIL, status=S.SENT, sent_at=timezone.now() - timedelta(days=30)
    )
    survey = shop.due_survey(shop.ana)

    _send_due(run_jobs)

    assert reload(survey).status == S.SKIPPED
    assert "cool-down" in reload(survey).reason
    assert meta.messages() == []


def test_an_expired_token_pauses_the_number_and_keeps_the_survey(
    whatsapp_shop: Shop, meta: SandboxServer, run_jobs
):
    meta.add_rule(to="*", code=190)
    survey = whatsapp_shop.due_survey(whatsapp_shop.ana)

    _send_due(run_jobs)

    org = Organization.objects.get(pk=whatsapp_shop.org.pk)
    assert org.whatsapp_paused_at is None  # the token is the number's own
    # The survey's store (Centro) has no number: it went from the organization's first one, alone paused.
    paused = dict(
        WhatsappNumber.objects.filter(organization=org).values_list("phone_number_id", "paused_reason")
    )
    assert "190" in paused[ORG_NUMBER_ID] and paused[PHONE_NUMBER_ID] == ""
    assert (reload(survey).status, reload(survey).attempts) == (S.SCHEDULED, 0)
    assert meta.messages() == []


def test_a_locked_business_account_pauses_the_organization_s_whatsapp_and_keeps_the_survey(
    whatsapp_shop: Shop, meta: SandboxServer, run_jobs
):
    meta.add_rule(to="*", code=131031)
    survey = whatsapp_shop.due_survey(whatsapp_shop.ana)

    _send_due(run_jobs)

    org = Organization.objects.get(pk=whatsapp_shop.org.pk)
    assert org.whatsapp_paused_at is not None and "131031" in org.whatsapp_paused_reason
    assert (reload(survey).status, reload(survey).attempts) == (S.SCHEDULED, 0)
    assert meta.messages() == []


def test_a_customer_who_stopped_marketing_messages_fails_the_survey_and_is_opted_out(
    whatsapp_shop: Shop, meta: SandboxServer, run_jobs
):
    meta.add_rule(to="5511999990001", code=131050)
    survey = whatsapp_shop.due_survey(whatsapp_shop.ana)

    _send_due(run_jobs)

    survey = reload(survey)
    assert survey.status == S.FAILED and "131050" in survey.reason
    whatsapp_shop.ana.refresh_from_db()
    assert whatsapp_shop.ana.whatsapp_opted_out_at is not None
    assert whatsapp_shop.ana.whatsapp_opt_out_source == "provider"


def test_a_missing_template_fails_the_survey_without_calling_meta(
    whatsapp_shop: Shop, meta: SandboxServer, run_jobs
):
    Organization.objects.filter(pk=whatsapp_shop.org.pk).update(survey_whatsapp_template="")
    survey = whatsapp_shop.due_survey(whatsapp_shop.ana)

    _send_due(run_jobs)

    assert reload(survey).status == S.FAILED
    assert "template" in reload(survey).reason
    assert meta.stats()["accepted"] + meta.stats()["rejected"] == 0


def test_a_graph_outage_spends_an_attempt_and_rq_retries_the_survey(
    whatsapp_shop: Shop, meta: SandboxServer, run_jobs
):
    meta.add_rule(to="5511999990001", http_status=503, times=1)
    survey = whatsapp_shop.due_survey(whatsapp_shop.ana)

    _send_due(run_jobs)

    assert (reload(survey).status, reload(survey).attempts) == (S.SCHEDULED, 1)
    job = jobs.fetch_job(f"survey-{survey.pk}")
    assert job is not None and job.get_status() == "scheduled"  # RQ's retry, 60 s later
    # the retry, run now
    assert sending.survey_send(survey_id=survey.pk) == "sent"
    assert (reload(survey).status, reload(survey).attempts) == (S.SENT, 2)
    assert len(meta.messages()) == 1


def test_a_survey_whose_send_timed_out_is_never_sent_twice(
    whatsapp_shop: Shop, meta: SandboxServer, run_jobs, monkeypatch
):

    from integrations import http

    # Meta answers after the worker stopped waiting: the request may well have been accepted, and
    # the Graph API takes no idempotency key, so a second try could reach the customer twice.
    monkeypatch.setattr(http, "POOL_ANSWER_TIMEOUT", 0.3)
    meta.configure(latency_ms=1000)
    survey = whatsapp_shop.due_survey(whatsapp_shop.ana, store=whatsapp_shop.shopping)

    _send_due(run_jobs)
    wait_for(lambda: meta.messages(), timeout=30, what="the sandbox to record the send")
    meta.configure(latency_ms=0)
    survey = reload(survey)
    assert survey.status == S.FAILED and survey.attempts == 1
    assert survey.reason.startswith("outcome unknown")
    # Nothing sends it again: not the job's retries, not the next dispatch, not a direct send.
    assert _send_due(run_jobs) == 0
    assert sending.survey_send(survey_id=survey.pk) == "nothing to do"
    assert len(meta.messages()) == 1


def test_a_survey_whose_connection_dropped_after_the_request_is_never_sent_twice(
    whatsapp_shop: Shop, meta: SandboxServer, run_jobs
):
    # Meta recorded the send and the connection broke before its answer: it may well have reached
    # the customer, and the Graph API takes no idempotency key.
    meta.add_rule(to="5511999990001", hang_up=True, times=1)
    survey = whatsapp_shop.due_survey(whatsapp_shop.ana, store=whatsapp_shop.shopping)

    _send_due(run_jobs)

    survey = reload(survey)
    assert len(meta.messages()) == 1
    assert survey.status == S.FAILED and survey.attempts == 1
    assert survey.reason.startswith("outcome unknown")
    assert _send_due(run_jobs) == 0
    assert sending.survey_send(survey_id=survey.pk) == "nothing to do"
    assert len(meta.messages()) == 1
