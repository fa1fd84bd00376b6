"""The embedded default, as a new user runs it: `manage.py up` with no DATABASE_URL or REDIS_URL
brings up its own PostgreSQL, Redis, web, workers and scheduler; a job goes through end to end;
Ctrl-C stops everything and leaves nothing running; starting again at once works and finds the
data where it was."""

from __future__ import annotations

import email
import email.policy
import http.cookiejar
import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import ROOT, wait_for

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _descendants(pid: int) -> set[int]:
    found: set[int] = set()
    todo = [pid]
    while todo:
        current = todo.pop()
        for task in Path(f"/proc/{current}/task").glob("*"):
            try:
                children = (task / "children").read_text().split()
            except OSError:
                continue
            for child in map(int, children):
                if child not in found:
                    found.add(child)
                    todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "State:\tZ" not in status


def _get(opener, url: str, timeout: float = 5) -> tuple[int, bytes]:
    try:
        with opener.open(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError:
        return 0, b""


@pytest.mark.timeout(600)  # two cold starts of the whole stack, on a machine shared with other tests
def test_up_runs_everything_embedded_and_ctrl_c_stops_it_all(tmp_path):
    var = tmp_path / "var"
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(
        CRM_VAR_DIR=str(var),
        ADMIN_USERNAME="admin",
        ADMIN_PASSWORD="smoke-test-Pw-123",
        PYTHONUNBUFFERED="1",
        LANGUAGE_CODE="en",  # it reads the commands' words
    )
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    argv = [
        sys.executable,
        "manage.py",
        "up",
        "--port",
        str(port),
        "--meta-port",
        str(_free_port()),
        "--smtp-port",
        str(_free_port()),
        "--erp-port",
        str(_free_port()),
        "--workers",
        "1",
        "--demo-customers",
        "5",
    ]
    log = (tmp_path / "up.log").open("wb")
    up = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )

    def manage(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    try:
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
        wait_for(
            lambda: _get(opener, f"{base}/healthz")[0] == 200,
            timeout=300,  # a hang guard: a first start migrates a new database
            interval=0.5,
            what="the embedded stack to answer /healthz",
        )
        health = json.loads(_get(opener, f"{base}/healthz")[1])
        assert health["checks"]["redis"]["ok"] and health["checks"]["database"]["ok"]
        assert (var / "postgres" / "PG_VERSION").exists()
        assert (var / "postgres" / ".s.PGSQL.5432").is_socket()
        assert Path(var / "redis.sock").is_socket()

        # Log in to the admin as the user `up` created, and read the queue metrics.
        status, page = _get(opener, f"{base}/admin/login/")
        assert status == 200
        token = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1).decode()
        form = urllib.parse.urlencode(
            {
                "username": "admin",
                "password": "smoke-test-Pw-123",
                "csrfmiddlewaretoken": token,
                "next": "/admin/",
            }
        ).encode()
        request = urllib.request.Request(
            f"{base}/admin/login/", data=form, headers={"Referer": f"{base}/admin/"}
        )
        with opener.open(request, timeout=10) as response:
            assert response.url.endswith("/admin/")
        status, body = _get(opener, f"{base}/admin/metrics")
        assert status == 200
        assert set(json.loads(body)) >= {"whatsapp-send", "email-send", "items-p1", "maintenance"}

        # A job end to end: enqueued from the command line, run by the supervised worker.
        assert manage("cron", "run", "recover").startswith("enqueued recover-manual-")
        wait_for(
            lambda: json.loads(manage("queue_stats", "--json"))["maintenance"]["completed"] >= 1,
            timeout=60,
            interval=1,
            what="the worker to finish the job",
        )
        assert "demo organization 'demo'" in (tmp_path / "up.log").read_text()

        # A WhatsApp campaign against the Meta sandbox that `up` started, as the README shows it.
        campaign_id = manage("demo_campaign", "--channel", "whatsapp").strip()
        manage("campaign_start", campaign_id)
        wait_for(
            lambda: json.loads(manage("campaign_status", campaign_id, "--json"))["status"] == "sent",
            timeout=60,
            interval=1,
            what="the demo campaign to be sent",
        )
        counts = json.loads(manage("campaign_status", campaign_id, "--json"))["counts"]
        # The sandbox posts signed status webhooks back to the web server: sent, delivered, read.
        assert counts["sent"] + counts["delivered"] + counts["read"] == 5

        # An email campaign through the SMTP sandbox that `up` started; it saves what it receives.
        campaign_id = manage("demo_campaign", "--channel", "email").strip()
        manage("campaign_start", campaign_id)
        wait_for(
            lambda: json.loads(manage("campaign_status", campaign_id, "--json"))["status"] == "sent",
            timeout=60,
            interval=1,
            what="the demo email campaign to be sent",
        )
        saved = sorted((var / "mail").glob("*.eml"))
        assert len(saved) == 5
        received = email.message_from_bytes(saved[0].read_bytes(), policy=email.policy.default)
        one_click = re.search(r"<(http://[^>]+)>", str(received["List-Unsubscribe"])).group(1)
        assert one_click.startswith(base)  # PUBLIC_URL follows --port
        # RFC 8058: the mail client POSTs with no cookie; the answer is a page, never a redirect.
        request = urllib.request.Request(one_click, data=b"List-Unsubscribe=One-Click", method="POST")
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200 and response.url == one_click

        # The same checkout cannot start a second embedded Redis.
        second = subprocess.run(
            [sys.executable, "manage.py", "up", "--port", str(_free_port()), "--no-sandboxes"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode != 0
        assert "already running" in second.stderr

        children = _descendants(up.pid)
        assert len(children) >= 5  # postgres, redis, web, workers (+ its worker), scheduler
        up.send_signal(signal.SIGINT)  # what Ctrl-C does
        assert up.wait(timeout=60) == 0
        # up has exited: its children are gone or going (reaped by init a moment later).
        wait_for(
            lambda: not [pid for pid in children if _alive(pid)], timeout=60, what="up's children to exit"
        )
        assert not (var / "redis.sock").exists() or not _socket_answers(var / "redis.sock")
        assert not _socket_answers(var / "postgres" / ".s.PGSQL.5432")

        # Started again at once, on the same ports (whose last connections sit in TIME_WAIT): it
        # comes up, and what the first run stored is there.
        up = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        wait_for(
            lambda: _get(opener, f"{base}/healthz")[0] == 200 or up.poll() is not None,
            timeout=300,  # a hang guard: a first start migrates a new database
            interval=0.5,
            what="the restarted stack to answer /healthz",
        )
        assert up.poll() is None, (tmp_path / "up.log").read_text()[-3000:]
        assert json.loads(manage("campaign_status", campaign_id, "--json"))["status"] == "sent"
        up.send_signal(signal.SIGINT)
        assert up.wait(timeout=60) == 0
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
        log.close()
    print((tmp_path / "up.log").read_text()[-3000:])


def _socket_answers(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX) as s:
        try:
            s.connect(str(path))
        except OSError:
            return False
    return True
