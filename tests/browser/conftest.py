"""Browser tests: the stack a user runs (`manage.py up` on free ports, its sandboxes, one worker
process and the scheduler) against this session's PostgreSQL test database and Redis, driven
through Debian's Chromium by Playwright. Screenshots of the main pages go to var/screenshots/.

Playwright never downloads a browser here: it launches /usr/bin/chromium, which scripts/setup
installs when it is missing. Without it these tests fail saying so, unless
CRM_SKIP_BROWSER_TESTS=1 (then they are skipped)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pytest
from django.db import connections

from tests.conftest import ROOT, child_env

if TYPE_CHECKING:
    from playwright.sync_api import Browser, BrowserContext, Page

HERE = Path(__file__).resolve().parent
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = ROOT / "var" / "screenshots"
STAFF_USERNAME, STAFF_PASSWORD = "admin", "Browser-test-Pw-2024"
CLERK_USERNAME, CLERK_PASSWORD = "vendedora", "Vendedora-Pw-2024"
MANAGER_USERNAME, MANAGER_PASSWORD = "demo-manager", "Gerente-Pw-2024"  # the demo's manager login
DEMO_CUSTOMERS = 30

T = TypeVar("T")
_taken: list[str] = []  # screenshot names taken in this session, for the summary


if os.environ.get("CRM_SKIP_BROWSER_TESTS") == "1" and importlib.util.find_spec("playwright") is None:
    collect_ignore_glob = ["test_*.py"]  # skipping anyway: do not fail on importing Playwright


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("CRM_SKIP_BROWSER_TESTS") != "1":
        return
    skip = pytest.mark.skip(reason="CRM_SKIP_BROWSER_TESTS=1")
    for item in items:
        if Path(item.path).is_relative_to(HERE):
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _taken:
        terminalreporter.write_line(f"browser screenshots ({len(_taken)}): {SCREENSHOTS}/")
        for name in _taken:
            terminalreporter.write_line(f"  {name}.png")


def screenshot(page: Page, name: str) -> Path:
    """A full-page PNG of what the browser shows now, as var/screenshots/<name>.png."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    if name not in _taken:
        _taken.append(name)
    return path


class Orm:
    """Runs database code on one plain thread: Playwright's sync API keeps an event loop running
    on the main thread, where Django refuses synchronous database calls."""

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="orm")

    def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return self._executor.submit(fn, *args, **kwargs).result(timeout=300)  # a hang guard only

    def close(self) -> None:
        self.run(connections.close_all)
        self._executor.shutdown()


@dataclass
class Stack:
    base: str
    log: Path
    orm: Orm
    ids: dict[str, int] = field(default_factory=dict)

    def url(self, path: str) -> str:
        return self.base + path

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(base: str) -> bool:
    """The web answers and a worker and the scheduler are alive."""
    try:
        with urllib.request.urlopen(f"{base}/healthz?full=1", timeout=5) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


@pytest.fixture(scope="session")
def chromium() -> Path:
    """Fails (never skips) when the browser or Playwright is missing."""
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(
            f"{CHROMIUM} is missing: the browser tests need Debian's chromium. Run scripts/setup as root "
            "(it installs it) or `apt-get install --no-install-recommends chromium`; "
            "CRM_SKIP_BROWSER_TESTS=1 skips these tests.",
            pytrace=False,
        )
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.fail("Playwright is missing: pip install -e '.[dev]' (scripts/setup does it)", pytrace=False)
    return CHROMIUM


def _seed() -> dict[str, int]:
    """The rows `up`'s demo does not make: a non-staff login and a runner handler to pause."""
    from django.contrib.auth import get_user_model

    from crm.models import Organization
    from runner.models import Direction, Handler, IntegrationType

    clerk = get_user_model().objects.create_user(CLERK_USERNAME, password=CLERK_PASSWORD)
    assert not clerk.is_staff
    org = Organization.objects.get(slug="demo")
    integration = IntegrationType.objects.create(integration_key="loja-virtual", name="Loja virtual")
    handler = Handler.objects.create(
        integration=integration,
        handler_key="pedidos",
        direction=Direction.INBOUND,
        callable_path="tests.runner.handlers",
        organization=org,
    )
    return {"organization": org.pk, "handler": handler.pk}


@pytest.fixture
def stack(chromium: Path, transactional_db: None, tmp_path: Path) -> Iterator[Stack]:
    """`manage.py up` as a user runs it, on free ports, with the demo (30 customers, a WhatsApp
    number on the Meta sandbox), a superuser made by `createsuperuser --noinput`, a non-staff
    user and a runner handler. Everything it writes is committed; the usual fixtures empty the
    test database and flush Redis afterwards."""
    env = child_env(
        CRM_VAR_DIR=str(tmp_path / "var"),
        DJANGO_SUPERUSER_PASSWORD=STAFF_PASSWORD,
        DEMO_MANAGER_PASSWORD=MANAGER_PASSWORD,
    )
    created = subprocess.run(
        [
            *(sys.executable, "manage.py", "createsuperuser", "--noinput"),
            *("--username", STAFF_USERNAME, "--email", "admin@example.com.br"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert created.returncode == 0, created.stderr
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "up.log"
    with log_path.open("wb") as log:
        up = subprocess.Popen(
            [
                *(sys.executable, "manage.py", "up", "--port", str(port), "--workers", "1"),
                *("--demo-customers", str(DEMO_CUSTOMERS), "--no-color"),
                *("--meta-port", str(_free_port()), "--smtp-port", str(_free_port())),
                *("--erp-port", str(_free_port()), "--chatwoot-port", str(_free_port())),
            ],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    orm = Orm()
    stack = Stack(base=base, log=log_path, orm=orm)
    try:
        deadline = time.monotonic() + 240  # a hang guard: `up` starts PostgreSQL, Redis and the demo
        while not _healthy(base):
            if up.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"`manage.py up` did not come up:\n{stack.log_tail()}", pytrace=False)
            time.sleep(0.5)
        stack.ids = orm.run(_seed)
        yield stack
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGINT)  # Ctrl-C: the supervisor stops everything
            try:
                up.wait(timeout=120)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(up.pid, signal.SIGKILL)
                up.wait(timeout=10)
        orm.close()


@pytest.fixture
def browser(chromium: Path, stack: Stack) -> Iterator[Browser]:
    """Set up after the stack, so closed before it: Playwright's event loop must be gone from the
    main thread when pytest-django empties the database."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture
def new_page(browser: Browser, stack: Stack) -> Iterator[Callable[[], Page]]:
    """Opens a fresh browser session (no cookies) that asks for pages in Brazilian Portuguese, in a
    window of the given size."""
    contexts: list[BrowserContext] = []

    from playwright.sync_api import expect

    def _open(*, width: int = 1440, height: int = 900) -> Page:
        context = browser.new_context(
            base_url=stack.base, locale="pt-BR", viewport={"width": width, "height": height}
        )
        # Hang guards, not expectations: a loaded machine can take many seconds for a page or a
        # condition (Playwright's own defaults are 30 s for actions and 5 s for `expect`).
        context.set_default_timeout(90_000)
        expect.set_options(timeout=90_000)
        contexts.append(context)
        return context.new_page()

    yield _open
    for context in contexts:
        context.close()


def log_in(page: Page, username: str, password: str, *, shot: str | None = None) -> None:
    page.goto("/admin/login/?next=/admin/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    if shot:
        screenshot(page, shot)
    page.click("#login-form [type=submit]")
    page.wait_for_load_state()
