"""Every management command of the project, as a new user meets it in a terminal: one line when
PostgreSQL or Redis cannot be reached, one language, help for every argument, `--watch`."""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import pty
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Iterator
from io import StringIO

import pytest
from django.core.management import CommandError, call_command, get_commands, load_command_class
from django.utils import timezone

from crm import cli, embedded, jobs, recovery
from crm.models import JobRun
from tests.conftest import ROOT, child_env

PROJECT_APPS = {
    "crm",
    "messaging",
    "campaigns",
    "erp",
    "surveys",
    "runner",
    "integrations",
    "flows",
    "project",
}
# Commands that are not a CrmCommand, and why.
NOT_CRM_COMMANDS = {"up": "it starts the services the others need; its output goes through its supervisor"}
# Arguments a command needs to get past argparse; the reachability check comes before anything else.
ARGS = {
    "campaign_start": ["1"],
    "campaign_cancel": ["1"],
    "campaign_status": ["1"],
    "erp_sync": ["customers"],
    "runner_run": ["crm-x", "leads"],
    "runner_consume": ["crm-x", "leads"],
    "dlq_replay": ["--execution", "1"],
    "membership": ["list"],
    "flows": ["status", "k", "--org", "o"],
    "demo_campaign_sales": ["1"],
}
CLOSED = "127.0.0.1:1"  # nothing listens on port 1


def project_commands() -> dict[str, str]:
    return {name: app for name, app in get_commands().items() if app in PROJECT_APPS}


def manage(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        cwd=ROOT,
        env=env or child_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_the_project_has_the_commands_git_knows():
    listed = subprocess.run(
        ["git", "ls-files", "*/management/commands/*.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    names = {os.path.basename(p)[:-3] for p in listed} - {"__init__"}
    assert {n for n in names if not n.startswith("_")} == set(project_commands())


@pytest.mark.parametrize("name", sorted(project_commands()))
def test_every_argument_of_every_command_has_help(name):
    command = load_command_class(project_commands()[name], name)
    parser = command.create_parser("manage.py", name)
    missing = []

    def walk(parser: argparse.ArgumentParser, where: str) -> None:
        for action in parser._actions:
            if not action.help or action.help == argparse.SUPPRESS:
                missing.append(f"{where} {'/'.join(action.option_strings) or action.dest}")
            if isinstance(action, argparse._SubParsersAction):
                for sub, subparser in action.choices.items():
                    walk(subparser, f"{where} {sub}")

    walk(parser, name)
    assert missing == []


@pytest.mark.parametrize("name", sorted(project_commands()))
def test_every_command_speaks_the_operators_language_and_checks_what_it_needs(name):
    command = load_command_class(project_commands()[name], name)
    if name in NOT_CRM_COMMANDS:
        assert not isinstance(command, cli.CrmCommand)
        return
    assert isinstance(command, cli.CrmCommand)
    assert set(command.needs) <= {cli.DATABASE, cli.REDIS}


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_every_command_says_in_one_line_what_it_cannot_reach():
    """Both services down: each command names exactly what it needs, on one line, and exits 1."""
    env = child_env(
        DATABASE_URL=f"postgres://postgres:db-Pass-w0rd@{CLOSED}/crm",
        REDIS_URL=f"redis://:redis-Pass-w0rd@{CLOSED}/0",
        LANGUAGE_CODE="en",
    )
    needing = {}
    for name, app in project_commands().items():
        command = load_command_class(app, name)
        if isinstance(command, cli.CrmCommand) and command.needs:
            needing[name] = command.needs
    assert {"campaign_start", "queue_stats", "workers", "scheduler", "demo"} <= set(needing)
    procs = {
        name: subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), name, *ARGS.get(name, [])],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in needing
    }
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=300)  # 2 cores, shared
        assert proc.returncode == 1, (name, out, err)
        assert out == "", (name, out)
        lines = err.splitlines()
        assert len(lines) == 1, (name, err)
        parts = []
        if cli.DATABASE in needing[name]:
            parts.append(rf"cannot connect to PostgreSQL at {CLOSED} \(.+\): check DATABASE_URL")
        if cli.REDIS in needing[name]:
            parts.append(rf"cannot connect to Redis at {CLOSED} \(.+\): check REDIS_URL")
        assert re.fullmatch("CommandError: " + "; ".join(parts), lines[0]), (name, lines[0])
        assert "Pass-w0rd" not in err


def test_the_embedded_mode_says_to_start_the_stack(tmp_path, transactional_db):
    env = child_env(CRM_VAR_DIR=str(tmp_path / "var"))
    del env["REDIS_URL"]  # the embedded Redis, which nothing started
    sock = embedded.servers(tmp_path / "var")[1].socket
    done = manage("queue_stats", env=env)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.splitlines() == [
        f"CommandError: sem conexão com Redis em {sock} (No such file or directory): "
        "inicie o ambiente com `make run`"
    ]


@contextlib.contextmanager
def redis_that_answers_one_connection() -> Iterator[int]:
    """A Redis stand-in on loopback that serves the first connection (PING and the client's
    handshake) and then stops listening: Redis going away while a command runs."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]

    def serve() -> None:
        conn, _ = listener.accept()
        listener.close()
        with conn:
            buffer = b""
            while chunk := conn.recv(65536):
                buffer += chunk
                while True:  # one RESP array per command: *N, then N bulk strings
                    lines = buffer.split(b"\r\n")
                    if len(lines) < 2 or not lines[0].startswith(b"*"):
                        break
                    n = int(lines[0][1:])
                    if len(lines) < 1 + 2 * n + 1:
                        break
                    name = lines[2].upper()
                    buffer = b"\r\n".join(lines[1 + 2 * n :])
                    replies = {b"PING": b"+PONG\r\n", b"HELLO": b"%1\r\n$5\r\nproto\r\n:3\r\n"}
                    conn.sendall(replies.get(name, b"+OK\r\n"))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield port
    finally:
        with contextlib.suppress(OSError):
            listener.close()


def test_redis_going_away_midway_is_one_line_too(transactional_db):
    with redis_that_answers_one_connection() as port:
        done = manage(
            "queue_stats", env=child_env(REDIS_URL=f"redis://127.0.0.1:{port}/0", LANGUAGE_CODE="en")
        )
    assert done.returncode == 1 and done.stdout == ""
    assert re.fullmatch(
        rf"CommandError: cannot connect to Redis at 127\.0\.0\.1:{port} \(.+\): check REDIS_URL\n",
        done.stderr,
    ), done.stderr


# --- one language ------------------------------------------------------------------------------------


def _waiting(n: int) -> None:
    jobs.get_connection().rpush("rq:queue:maintenance", *[f"job-{i}" for i in range(n)])


def test_queue_stats_speaks_portuguese_by_default_and_groups_thousands():
    _waiting(1234)
    out = StringIO()
    call_command("queue_stats", stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[0].split() == ["fila", "aguardando", "ativos", "falhas", "concluídos", "adiados"]
    assert next(line for line in lines if line.startswith("maintenance")).split() == [
        "maintenance",
        "1.234",
        "0",
        "0",
        "0",
        "0",
    ]
    assert lines[-1].split()[:2] == ["total", "1.234"]


def test_queue_stats_in_english(english):
    _waiting(1234)
    out = StringIO()
    call_command("queue_stats", stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[0].split() == ["queue", "waiting", "active", "failed", "completed", "delayed"]
    assert lines[-1].split()[:2] == ["total", "1,234"]


def test_errors_name_what_they_could_not_find(db):
    with pytest.raises(CommandError) as raised:
        call_command("cron", "run", "nope")
    assert re.fullmatch(r"não há entrada cron 'nope' \(entradas: .*recover.*\)", str(raised.value))
    with pytest.raises(CommandError, match=r"^indique a entrada a executar \(entradas: .*recover"):
        call_command("cron", "run")
    with pytest.raises(CommandError, match=r"^fila desconhecida 'nope' \(filas: .*email-send"):
        call_command("workers", "--queues", "email-send,nope")
    with pytest.raises(CommandError, match=r"^não há organização 'nope' \(organizações: \(nenhum\)\)$"):
        call_command("segments_snapshot", "--org", "nope")


# --- progress -----------------------------------------------------------------------------------------


def test_recover_reports_its_progress(db):
    JobRun.objects.create(  # its job was lost with Redis
        kind="test",
        key="1",
        func="crm.tasks.noop",
        queue="maintenance",
        job_id="lost-1",
        started_at=timezone.now() - 2 * recovery.MIN_AGE,
    )
    told: list[tuple[str, int]] = []
    result = recovery.recover(dry_run=True, progress=lambda name, n: told.append((name, n)))
    assert result["job-runs"] == 1
    assert told == [("job-runs", 1)]


def run_in_a_terminal(
    args: list[str], *, until: str, env: dict[str, str], interrupt: bool = False, timeout: float = 60
) -> str:
    """Run `manage.py args` with stdout and stderr on a 100-column pseudo-terminal; read until
    `until` shows (then Ctrl-C it if `interrupt`) and it exits; returns everything it wrote."""
    main, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), *args],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=child,
        stderr=child,
        start_new_session=True,
    )
    os.close(child)
    seen = b""
    deadline = time.monotonic() + timeout
    try:
        while until.encode() not in seen and time.monotonic() < deadline:
            ready, _, _ = select.select([main], [], [], 0.5)
            if ready:
                try:
                    seen += os.read(main, 65536)
                except OSError:  # the child closed the terminal
                    break
        if interrupt:
            os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=30) == 0, seen.decode(errors="replace")
        with contextlib.suppress(OSError):
            while select.select([main], [], [], 0.2)[0]:
                chunk = os.read(main, 65536)
                if not chunk:
                    break
                seen += chunk
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        os.close(main)
    return seen.decode(errors="replace")


def test_recover_shows_a_progress_bar_on_a_terminal(transactional_db):
    out = run_in_a_terminal(["recover"], until="total:", env=child_env())
    assert re.search(r"verificando: 0 jobs \[", out), out  # tqdm's bar, in the operator's language
    assert "total: 0 reenfileirado" in out


# --- --watch ------------------------------------------------------------------------------------------


def test_queue_stats_watch_json_prints_one_object_per_line_until_ctrl_c(transactional_db):
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "queue_stats", "--watch", "0.2", "--json"],
        cwd=ROOT,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())
        _waiting(3)
        frames = 1
        while json.loads(proc.stdout.readline())["maintenance"]["waiting"] != 3:  # refreshed, not reprinted
            frames += 1
            assert frames < 1000, "no frame showed the new count"  # 0.2 s each: a hang guard
        assert first["maintenance"] == {
            "waiting": 0,
            "active": 0,
            "failed": 0,
            "completed": 0,
            "delayed": 0,
        }
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0 and err == ""
    for line in out.splitlines():  # nothing but JSON objects, Ctrl-C included
        assert set(json.loads(line)) == set(first)


def test_queue_stats_watch_redraws_in_place_on_a_terminal(transactional_db):
    out = run_in_a_terminal(
        ["queue_stats", "--watch", "0.2"], until="\x1b[J", env=child_env(LANGUAGE_CODE="en"), interrupt=True
    )
    first, _, rest = out.partition("\x1b[")
    assert first.split()[:6] == ["queue", "waiting", "active", "failed", "completed", "delayed"]
    assert "every 0.2 s, last at" in first and "Ctrl-C to stop" in first
    assert re.match(r"\d+F", rest)  # back up over the frame, clear, draw the next one


def test_watch_needs_a_positive_interval():
    with pytest.raises(CommandError, match="--watch"):
        call_command("queue_stats", "--watch", "0", stdout=StringIO())
