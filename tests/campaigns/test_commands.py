"""The campaign commands in a terminal: nothing changes when Redis is down, one language, --watch."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from campaigns.models import Campaign, CampaignMetric, WhatsappMessage
from crm.models import JobRun
from tests.conftest import ROOT, child_env

SENT = WhatsappMessage.Status.SENT


def manage(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        cwd=ROOT,
        env=child_env(**env),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_campaign_start_with_redis_down_says_so_in_one_line_and_changes_nothing(wa):
    wa["customers"](3)
    campaign = wa["campaign"]()
    done = manage("campaign_start", str(campaign.pk), REDIS_URL="redis://:Redis-s3cret@127.0.0.1:1/0")
    assert done.returncode == 1 and done.stdout == ""
    assert re.fullmatch(
        r"CommandError: sem conexão com Redis em 127\.0\.0\.1:1 \(.+\): verifique REDIS_URL\n", done.stderr
    ), done.stderr
    assert "s3cret" not in done.stderr
    campaign.refresh_from_db()
    assert (campaign.status, campaign.started_at) == (Campaign.Status.DRAFT, None)
    assert not JobRun.objects.exists() and not CampaignMetric.objects.exists()


def test_campaign_start_with_postgresql_down_names_it(wa):
    campaign = wa["campaign"]()
    done = manage(
        "campaign_start", str(campaign.pk), DATABASE_URL="postgres://postgres:Db-s3cret@127.0.0.1:1/crm"
    )
    assert done.returncode == 1 and done.stdout == ""
    assert re.fullmatch(
        r"CommandError: sem conexão com PostgreSQL em 127\.0\.0\.1:1 \(.+\): verifique DATABASE_URL\n",
        done.stderr,
    ), done.stderr
    assert "s3cret" not in done.stderr


def _status(campaign: Campaign, *args: str) -> str:
    out = StringIO()
    call_command("campaign_status", str(campaign.pk), *args, stdout=out)
    return out.getvalue()


def test_the_campaign_commands_speak_portuguese_by_default(wa, run_jobs):
    wa["customers"](3)
    campaign = wa["campaign"](name="Natal")
    out = StringIO()
    call_command("campaign_start", str(campaign.pk), stdout=out)
    assert out.getvalue() == f"campanha {campaign.pk}: enviando\n"
    run_jobs()
    CampaignMetric.objects.filter(campaign=campaign).update(cost="1234.5")
    lines = _status(campaign).splitlines()
    assert re.fullmatch(
        rf"campanha {campaign.pk} 'Natal': enviada  100,0%  ritmo [\d,]+/s  custo 1\.234,500000 USD", lines[0]
    ), lines
    assert lines[1].startswith("na fila 0  enviando 0  enviadas 3  entregues 0  lidas 0")
    with pytest.raises(CommandError) as raised:
        call_command("campaign_start", str(campaign.pk))
    assert str(raised.value).startswith(f"a campanha {campaign.pk} está enviada; só uma campanha")
    with pytest.raises(CommandError, match=r"^não há campanha 999999 \(os ids estão"):
        call_command("campaign_status", "999999")


def test_the_campaign_commands_in_english(wa, run_jobs, english):
    wa["customers"](3)
    campaign = wa["campaign"](name="Xmas")
    out = StringIO()
    call_command("campaign_start", str(campaign.pk), stdout=out)
    assert out.getvalue() == f"campaign {campaign.pk} is sending\n"
    run_jobs()
    CampaignMetric.objects.filter(campaign=campaign).update(cost="1234.5")
    lines = _status(campaign).splitlines()
    assert re.fullmatch(
        rf"campaign {campaign.pk} 'Xmas': sent  100.0%  rate [\d.]+/s  cost 1,234.500000 USD", lines[0]
    )
    assert lines[1].startswith("queued 0  sending 0  sent 3  delivered 0  read 0")
    with pytest.raises(CommandError, match=f"^campaign {campaign.pk} is sent; only a draft or scheduled"):
        call_command("campaign_start", str(campaign.pk))


def test_campaign_status_watch_json_prints_one_object_per_line_and_stops_when_the_campaign_ends(wa):
    campaign = wa["campaign"]()
    Campaign.objects.filter(pk=campaign.pk).update(status=Campaign.Status.SENDING)
    keys = set(json.loads(_status(campaign, "--json")))
    proc = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "manage.py"),
            "campaign_status",
            str(campaign.pk),
            "--watch",
            "0.2",
            "--json",
        ],
        cwd=ROOT,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        for _ in range(2):
            frame = json.loads(proc.stdout.readline())
            assert set(frame) == keys and frame["status"] == "sending"
        Campaign.objects.filter(pk=campaign.pk).update(status=Campaign.Status.CANCELLED)
        out, err = proc.communicate(timeout=30)  # it ends by itself
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and err == ""
    frames = [json.loads(line) for line in out.splitlines()]
    assert frames[-1]["status"] == "cancelled" and all(set(f) == keys for f in frames)


def test_campaign_status_watch_text_on_a_pipe_prints_frames_one_after_another(wa):
    campaign = wa["campaign"]()
    Campaign.objects.filter(pk=campaign.pk).update(status=Campaign.Status.SENT)
    out = StringIO()
    call_command("campaign_status", str(campaign.pk), "--watch", "0.2", stdout=out)  # finished: one frame
    assert out.getvalue() == _status(campaign) and "\x1b" not in out.getvalue()
