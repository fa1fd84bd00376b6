"""WhatsApp message templates: Meta's answer parsed defensively, fetched page by page from the
sandbox over real HTTP, stored per business account, synced by command, job and cron."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.core.management import call_command
from hypothesis import given
from hypothesis import strategies as st

from crm import cron
from crm.models import Organization
from integrations import services
from integrations.errors import IntegrationError
from integrations.models import WhatsappNumber, WhatsappTemplate
from integrations.whatsapp.templates import fetch_templates, parse_page, parse_template
from project.sandboxes.whatsapp import SandboxServer
from project.sandboxes.whatsapp import templates as sandbox_templates

TOKEN = "EAAG-templates-token-0123456789"
WABA = "102290129340398"

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=30),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=20,
)
component = st.fixed_dictionaries(
    {"type": st.sampled_from(["HEADER", "BODY", "FOOTER", "BUTTONS", "body", "OTHER", 3])},
    optional={
        "text": st.text(max_size=60) | st.integers(),
        "format": st.sampled_from(["TEXT", "IMAGE", None]),
        "buttons": st.lists(
            st.fixed_dictionaries(
                {"type": st.sampled_from(["URL", "QUICK_REPLY", 1])}, optional={"url": json_values}
            ),
            max_size=3,
        )
        | json_values,
    },
)
template_like = st.fixed_dictionaries(
    {},
    optional={
        "name": st.text(max_size=20) | json_values,
        "language": st.sampled_from(["pt_BR", "en_US", ""]) | json_values,
        "status": st.sampled_from(["APPROVED", "rejected", "PAUSED", "WHATEVER"]) | json_values,
        "components": st.lists(component | json_values, max_size=5) | json_values,
        "id": json_values,
    },
)


@given(template_like)
def test_parsing_never_raises_and_keeps_only_what_it_can_read(raw) -> None:
    template = parse_template(raw)
    if template is None:
        return
    assert template.name.strip() and template.language.strip()
    assert template.status in {"APPROVED", "REJECTED", "PAUSED"}
    assert template.variables == sorted(set(template.variables))
    assert isinstance(template.sendable_reason, str)


@given(json_values)
def test_a_page_of_anything_is_templates_or_an_integration_error(data) -> None:
    try:
        templates, after = parse_page(data)
    except IntegrationError:
        assert not isinstance(data, dict)
        return
    assert isinstance(after, str)
    assert all(t.name for t in templates)


@given(st.lists(st.integers(min_value=1, max_value=9), min_size=1, max_size=6))
def test_body_variables_are_read_once_each_in_order(numbers) -> None:
    body = " ".join(f"x {{{{{n}}}}}" for n in numbers)
    template = parse_template(
        {
            "name": "t",
            "language": "pt_BR",
            "status": "APPROVED",
            "components": [{"type": "BODY", "text": body}],
        }
    )
    assert template is not None
    assert template.variables == sorted(set(numbers))
    expected_ok = sorted(set(numbers)) == list(range(1, len(set(numbers)) + 1))
    assert (template.sendable_reason == "") is expected_ok


def test_header_and_buttons_are_read_as_meta_sends_them() -> None:
    template = parse_template(sandbox_templates.PROMO_DEMO)
    assert template is not None
    assert (template.header_format, template.variables) == ("IMAGE", [1, 2])
    assert [(b.index, b.type, b.dynamic) for b in template.buttons] == [
        (0, "URL", True),
        (1, "QUICK_REPLY", False),
    ]
    assert template.footer.startswith("Responda SAIR")
    named = parse_template(
        {
            "name": "n",
            "language": "pt_BR",
            "status": "APPROVED",
            "components": [{"type": "BODY", "text": "Oi {{nome}}"}],
        }
    )
    assert named is not None and named.sendable_reason


@pytest.fixture
def sandbox() -> Iterator[SandboxServer]:
    with SandboxServer(tokens=[TOKEN]) as server:
        yield server


def test_every_page_is_fetched_from_the_sandbox(sandbox, monkeypatch) -> None:
    monkeypatch.setattr("integrations.whatsapp.templates.PAGE_SIZE", 2)  # 7 templates: 4 pages
    templates = fetch_templates(base_url=sandbox.url, version="v23.0", waba_id=WABA, access_token=TOKEN)
    assert [(t.name, t.language) for t in templates] == [
        (t["name"], t["language"]) for t in sandbox_templates.TEMPLATES
    ]
    assert {t.status for t in templates} == {"APPROVED", "REJECTED", "PAUSED"}


def test_a_wrong_token_is_a_permanent_error(sandbox) -> None:
    with pytest.raises(IntegrationError) as caught:
        fetch_templates(base_url=sandbox.url, version="v23.0", waba_id=WABA, access_token="wrong")
    assert caught.value.status == 401 or not caught.value.retryable


@pytest.fixture
def account(db, sandbox) -> WhatsappNumber:
    org = Organization.objects.create(name="Loja Modelo", slug="modelo")
    number = WhatsappNumber(
        organization=org,
        display_phone_number="+5511940000000",
        phone_number_id="109876543210",
        business_account_id=WABA,
        graph_url=sandbox.url,
    )
    number.set_access_token(TOKEN)
    number.save()
    return number


def test_sync_stores_every_template_and_forgets_those_meta_dropped(account) -> None:
    stale = WhatsappTemplate.objects.create(
        organization=account.organization,
        business_account_id=WABA,
        name="gone",
        language="pt_BR",
        status="APPROVED",
    )
    counts = services.whatsapp_templates_sync(number=account)
    assert counts == {"templates": 7, "approved": 5, "removed": 1}
    assert not WhatsappTemplate.objects.filter(pk=stale.pk).exists()
    promo = WhatsappTemplate.objects.get(name="promo_demo", language="pt_BR")
    assert (promo.variable_count, promo.header_format, promo.selectable) == (2, "IMAGE", True)
    assert promo.buttons[0] == {
        "index": 0,
        "type": "URL",
        "text": "Ver ofertas",
        "url": promo.buttons[0]["url"],
        "dynamic": True,
    }
    assert not WhatsappTemplate.objects.get(name="black_friday").selectable
    assert not WhatsappTemplate.objects.get(name="reativacao").selectable
    again = services.whatsapp_templates_sync(number=account)
    assert again["removed"] == 0 and WhatsappTemplate.objects.count() == 7


def test_the_command_syncs_and_a_failing_account_fails_it(account, capsys, english) -> None:
    call_command("whatsapp_templates_sync", "--org", "modelo")
    assert WhatsappTemplate.objects.filter(organization=account.organization).count() == 7
    account.set_access_token("revoked")
    account.save(update_fields=["access_token_encrypted"])
    with pytest.raises(Exception, match="could not be synced"):
        call_command("whatsapp_templates_sync")
    assert WhatsappTemplate.objects.count() == 7  # what was synced stays


def test_the_admin_button_syncs_in_a_job(
    account, run_jobs, admin_client, django_capture_on_commit_callbacks
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        response = admin_client.post("/admin/integrations/whatsapptemplate/sync/")
    assert response.status_code == 302
    run_jobs()
    assert WhatsappTemplate.objects.filter(status="APPROVED").count() == 5
    page = admin_client.get("/admin/integrations/whatsapptemplate/")
    assert b"promo_demo" in page.content and b"sync-templates" in page.content


def test_it_runs_daily_from_the_cron_table() -> None:
    entry = cron.cron_table()["whatsapp-templates-sync"]
    assert entry.func == "integrations.tasks.whatsapp_templates_sync"
    assert len(entry.next_runs(2)) == 2
