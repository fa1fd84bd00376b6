"""The demo's WhatsApp numbers carry a business account id, so `demo` syncs the demo's templates
from the Meta sandbox as a real account's are synced from Meta, and the demo campaign uses one."""

from __future__ import annotations

from io import StringIO

from django.core.management import call_command

from campaigns import composer
from campaigns.models import Campaign
from integrations.models import WhatsappTemplate
from project.demo.integrations import DEMO_ACCESS_TOKEN, DEMO_PHONE_NUMBER_IDS, DEMO_WABA_ID
from project.sandboxes.whatsapp import SandboxServer


def test_the_demo_syncs_its_templates_and_its_campaign_uses_a_synced_one(transactional_db, run_jobs, english):
    with SandboxServer(numbers=dict.fromkeys(DEMO_PHONE_NUMBER_IDS, DEMO_ACCESS_TOKEN)) as sandbox:
        out = StringIO()
        call_command("demo", customers=3, graph_url=sandbox.url, stdout=out)
        assert "templates synced" in out.getvalue()
        synced = WhatsappTemplate.objects.filter(business_account_id=DEMO_WABA_ID)
        assert synced.filter(status=WhatsappTemplate.Status.APPROVED).count() >= 5
        out = StringIO()
        call_command("demo_campaign", "--channel", "whatsapp", stdout=out)
        campaign = Campaign.objects.get(pk=int(out.getvalue().strip()))
        template = composer.campaign_template(campaign)
        assert template is not None and template.name == "promo_demo"
        assert composer.template_problem(campaign) == ""
        call_command("campaign_start", str(campaign.pk), stdout=StringIO())
        run_jobs()
        assert len(sandbox.messages()) == 3
