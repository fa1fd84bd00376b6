"""The test world: real PostgreSQL (pytest-django's test database), a real Redis database that is
flushed around every test, in-process burst workers and real worker processes."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.conf import settings
from rq import Worker

from crm import inbox_intake, inbox_kinds, jobs, queues, workers
from crm.models import Customer, Organization, Store

ROOT = Path(__file__).resolve().parent.parent

# The tests' servers and sandboxes listen on loopback: outbound URLs may point there (this process,
# and the workers and web servers it starts). tests/integrations/test_outbound.py turns it off.
os.environ["ALLOW_PRIVATE_OUTBOUND_URLS"] = "true"
settings.ALLOW_PRIVATE_OUTBOUND_URLS = True


@pytest.fixture(autouse=True, scope="session")
def _static_root() -> None:
    # WhiteNoise warns about a STATIC_ROOT that `collectstatic` has not created yet.
    Path(settings.STATIC_ROOT).mkdir(parents=True, exist_ok=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The long tests first (real processes and servers, committed transactions, property-based
    tests): spread over xdist's processes from the start (`--dist worksteal`), they do not leave one
    process running the longest tests at the end while the others are idle."""

    def weight(item: pytest.Item) -> int:
        fixtures = getattr(item, "fixturenames", ())
        marker = item.get_closest_marker("django_db")
        if (
            item.get_closest_marker("slow")
            or "web_server" in fixtures
            or "transactional_db" in fixtures
            or (marker is not None and marker.kwargs.get("transaction"))
            or getattr(getattr(item, "obj", None), "is_hypothesis_test", False)
        ):
            return 0
        return 1

    items.sort(key=weight)  # stable: the order within each group stays the files' order


@pytest.fixture(autouse=True)
def _one_language() -> Iterator[None]:
    """Every test starts in the settings' language: a view or command that activated another one
    must not change what the next test (on the same process) reads."""
    from django.utils import translation

    translation.deactivate()
    yield
    translation.deactivate()


OTHER_SESSIONS = """
    SELECT application_name, state, backend_start, left(query, 120) FROM pg_stat_activity
    WHERE datname = current_database() AND pid <> pg_backend_pid()
"""


@pytest.fixture(autouse=True, scope="session")
def _no_session_left(django_db_setup, django_db_blocker) -> Iterator[None]:
    """Before the test database is dropped (which fails while any session uses it): the inbox's
    group-commit thread closes its connection now, and every other session is gone. One that stays
    is named (its application_name is the test that started its process, see child_env)."""
    yield
    from django.db import connection

    assert inbox_intake.group_commit_close(timeout=60), "the inbox's group-commit thread did not answer"
    with django_db_blocker.unblock():
        others: list = []

        def nobody_else() -> bool:
            with connection.cursor() as cursor:
                cursor.execute(OTHER_SESSIONS)
                others[:] = cursor.fetchall()
            return not others

        deadline = time.monotonic() + 60  # a hang guard: processes being killed let go in moments
        while not nobody_else() and time.monotonic() < deadline:
            time.sleep(0.2)
        connection.close()
    if others:
        warnings.warn(f"sessions still on the test database: {others}", stacklevel=1)


@pytest.fixture(autouse=True)
def redis_db() -> Iterator:
    """Every test starts and ends with an empty Redis database of its own."""
    connection = jobs.get_connection()
    db = connection.connection_pool.connection_kwargs.get("db", 0)
    assert db != 0 or os.environ.get("CRM_TESTS_ALLOW_REDIS_DB0"), (
        "tests flush their Redis database: point REDIS_URL at a spare one (e.g. redis://127.0.0.1:6379/9)"
    )
    connection.flushdb()
    yield connection
    connection.flushdb()


@pytest.fixture
def run_jobs() -> Callable[..., None]:
    """Run every queued (and soon-due delayed) job in this process, like `workers --burst`."""

    def _run(queue_names: list[str] | None = None, settle: float = 3.0) -> None:
        inbox_intake.wake_owed()  # what an intake of this process accepted is drained by these workers
        workers.run_burst(queue_names or list(queues.QUEUE_NAMES), settle=settle)

    return _run


@pytest.fixture
def drain_inbox(run_jobs, django_capture_on_commit_callbacks) -> Callable[[], None]:
    """Apply what the intakes accepted, as the workers do: wake every kind's drain and run the
    inbox queue (in a test inside a transaction, where no commit ever wakes them)."""

    def _drain() -> None:
        with django_capture_on_commit_callbacks(execute=True):
            for kind in inbox_kinds.kinds():
                inbox_intake.wake(kind)
        with django_capture_on_commit_callbacks(execute=True):
            run_jobs([queues.INBOX], settle=0)

    return _drain


def redis_keys_holding(connection, secret: str) -> list[bytes]:
    """Every Redis key whose name, fields or values (zlib-compressed job data included) contain `secret`."""
    import contextlib
    import zlib

    found = []
    for key in connection.scan_iter(count=1000):
        kind = connection.type(key).decode()
        values: list = [key]
        if kind == "string":
            values.append(connection.get(key))
        elif kind == "hash":
            values += list(connection.hgetall(key).values()) + list(connection.hkeys(key))
        elif kind == "list":
            values += connection.lrange(key, 0, -1)
        elif kind == "zset":
            values += [m for m, _ in connection.zrange(key, 0, -1, withscores=True)]
        elif kind == "set":
            values += list(connection.smembers(key))
        for value in values:
            raw = value if isinstance(value, bytes) else str(value).encode()
            with contextlib.suppress(zlib.error):
                raw += zlib.decompress(raw)
            if secret.encode() in raw:
                found.append(key)
                break
    return found


def recorded(key: str) -> list[str]:
    values = jobs.get_connection().lrange(f"crm:test:{key}", 0, -1)
    return [v.decode() if isinstance(v, bytes) else str(v) for v in values]


@pytest.fixture
def world(db) -> dict:
    """A small named world: an organization, a store and three customers."""
    org = Organization.objects.create(name="Loja Teste", slug="teste")
    store = Store.objects.create(organization=org, erp_code="001", name="Centro")
    customers = [
        Customer.objects.create(
            marketing_consent=True,
            organization=org,
            erp_id="C1",
            name="Ana Silva",
            email="ana@example.com.br",
            phone="+5511999990001",
        ),
        Customer.objects.create(
            marketing_consent=True,
            organization=org,
            erp_id="C2",
            name="Bruno Souza",
            email="bruno@example.com.br",
            phone="+5521999990002",
        ),
        Customer.objects.create(
            marketing_consent=True, organization=org, erp_id="C3", name="Carla Lima", email="", phone=""
        ),
    ]
    return {"org": org, "store": store, "customers": customers}


def child_env(**extra: str) -> dict[str, str]:
    """Environment for a child process that must see this test's database and Redis."""
    env = dict(os.environ)
    db = settings.DATABASES["default"]
    host = urllib.parse.quote(db["HOST"], safe="")  # a socket directory is percent-encoded
    port = f":{db['PORT']}" if db.get("PORT") else ""
    # Named after the test that starts the process: a session it leaves behind says whose it is.
    test = os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0].rsplit("/", 1)[-1][-60:]
    name = urllib.parse.quote(test or "pytest-child", safe="")
    credentials = f"{db['USER']}:{db.get('PASSWORD') or ''}"
    env["DATABASE_URL"] = f"postgres://{credentials}@{host}{port}/{db['NAME']}?application_name={name}"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def _descendants(pid: int) -> list[int]:
    """Every process below `pid`, read from /proc (children, their children...)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _threads(pid: int) -> str:
    """Each thread of `pid` and its descendants: state, kernel wait channel, system call (/proc)."""
    lines = []
    for process in [pid, *_descendants(pid)]:
        with contextlib.suppress(OSError):
            for task in sorted(Path(f"/proc/{process}/task").iterdir()):
                state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
                wchan, syscall = (task / "wchan").read_text(), (task / "syscall").read_text().split()[:2]
                call = " ".join(syscall)
                lines.append(f"  {process}/{task.name}: state={state} wchan={wchan} syscall={call}")
    return "\n".join(lines)


class WorkerProcess:
    """`manage.py workers` as a real process (its own process group, killed at teardown)."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        # A file, not a pipe: a pipe nobody reads fills up (64 KiB of tracebacks while PostgreSQL
        # is away) and then blocks the workers on their next log line.
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - closed by output()
        self.popen = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "workers", *args],
            cwd=ROOT,
            env=env or child_env(),
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """`sig` to the supervisor's process group; SIGKILL to its worker processes too: each runs
        in a session of its own (crm.supervisor), and one left alive by its supervisor's death
        only gets SIGTERM (a warm stop: it finishes its job, connected to the test's database)."""
        pool = _descendants(self.popen.pid) if sig == signal.SIGKILL else []
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, sig)
        for pid in pool:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def wait(self, timeout: float) -> int:
        """The exit status; on timeout the failure carries the process's log tail and the state of
        each of its threads (a worker that does not exit says where it is)."""
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            self.log.seek(0)
            tail = self.log.read().decode(errors="replace")[-4000:]
            pytest.fail(f"{exc}\nits threads:\n{_threads(self.popen.pid)}\nits log:\n{tail}")

    def wait_ready(self, processes: int = 1, timeout: float = 120) -> None:
        """Until `processes` of its worker processes are past their start (idle or busy): their
        signal handlers are in place, so a SIGTERM is a warm stop. One told to stop before that
        dies of the signal (RQ installs its handlers after registering)."""

        def ready() -> bool:
            pids = {self.popen.pid, *_descendants(self.popen.pid)}
            registered = Worker.all(connection=jobs.get_connection())
            return sum(w.pid in pids and w.get_state() in ("idle", "busy") for w in registered) >= processes

        wait_for(ready, timeout=timeout, what=f"{processes} worker process(es) ready")

    def output(self) -> str:
        self.kill(signal.SIGTERM)
        try:
            self.popen.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.kill()
            self.popen.wait()
        self.log.seek(0)
        return self.log.read().decode(errors="replace")


@pytest.fixture
def worker_process() -> Iterator[Callable[..., WorkerProcess]]:
    started: list[WorkerProcess] = []

    def _start(*args: str, env: dict[str, str] | None = None) -> WorkerProcess:
        proc = WorkerProcess(*args, env=env)
        started.append(proc)
        return proc

    yield _start
    for proc in started:
        proc.kill()
        proc.popen.wait(timeout=60)


def wait_for(predicate: Callable[[], object], timeout: float, interval: float = 0.1, what: str = "") -> float:
    """Poll until predicate() is truthy; returns the seconds it took. Fails the test on timeout."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            pytest.fail(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)
    return time.monotonic() - start


@pytest.fixture
def english(settings) -> None:
    """Pages in English (the default is Brazilian Portuguese), for tests that read their words."""
    settings.LANGUAGE_CODE = "en"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def web_server(transactional_db) -> Iterator[str]:
    """The production web server (gunicorn, as `manage.py up` runs it) on a free port, serving this
    test's database and Redis; yields its base URL. For tests of load, where Django's test server
    (one thread per connection, resets under a burst) would be what fails."""
    from project.management.commands.up import manage_gunicorn

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [*manage_gunicorn(), "--bind", f"127.0.0.1:{port}", "--backlog", "2048"],
        cwd=ROOT,
        env=child_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )

    def answers() -> bool:
        try:
            with urllib.request.urlopen(f"{base}/healthz", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    try:
        wait_for(answers, timeout=60, interval=0.2, what="gunicorn to answer /healthz")
        yield base
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
