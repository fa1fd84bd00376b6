"""What the sandboxes of external systems share: an aiohttp app on its own event loop in a
daemon thread, started and stopped from any thread (tests, `manage.py up`, benchmarks)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import signal
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Self, TypeVar

from aiohttp import web

logger = logging.getLogger(__name__)

T = TypeVar("T")
# Only a hang guard: a helper waits for the server's loop, which a loaded machine can keep busy for
# seconds (a test asks for stats while hundreds of sends and webhooks are in flight).
HELPER_TIMEOUT = 120.0


class ThreadedAppServer:
    thread_name = "sandbox"
    backlog = 128

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self.port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._bound_port: int | None = None

    @property
    def url(self) -> str:
        """The base URL, e.g. ``http://127.0.0.1:8081``; only once started."""
        if self._bound_port is None:
            raise RuntimeError("the sandbox is not running; call start() first")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self._bound_port}"

    def make_app(self) -> web.Application:
        raise NotImplementedError

    def before_start(self) -> None:
        """Runs in the caller's thread before the server thread starts."""

    async def on_startup(self) -> None:
        """Runs on the server's loop before the socket opens."""

    async def on_shutdown(self) -> None:
        """Runs on the server's loop before the app stops serving."""

    async def on_closed(self) -> None:
        """Runs on the server's loop after the app stopped serving."""

    def start(self) -> Self:
        """Start serving in a daemon thread; returns self once the socket is listening.

        Raises OSError (e.g. the port is taken) or RuntimeError if already started.
        """
        if self._thread is not None:
            raise RuntimeError("the sandbox is already running")
        self.before_start()
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self._loop = loop
            try:
                loop.run_until_complete(self._startup())
            # Whatever went wrong is re-raised by start() in the caller's thread.
            except Exception as exc:
                failure.append(exc)
                loop.run_until_complete(self._shutdown())
                loop.close()
                ready.set()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

        self._thread = threading.Thread(target=run, name=self.thread_name, daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._thread.join()
            self._thread = self._loop = None
            raise failure[0]
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving and join the thread; a no-op when not running."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(timeout)
        except concurrent.futures.TimeoutError:
            logger.warning(
                "%s: shutdown took over %.0fs; stopping the loop anyway", self.thread_name, timeout
            )
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout)
            self._thread = self._loop = None
            self._bound_port = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    async def _startup(self) -> None:
        await self.on_startup()
        # No access log: at thousands of requests per second it would cost more than the handler.
        self._runner = web.AppRunner(self.make_app(), access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, backlog=self.backlog, reuse_address=True)
        await site.start()
        self._bound_port = self._runner.addresses[0][1]

    async def _shutdown(self) -> None:
        await self.on_shutdown()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self.on_closed()

    def _on_loop(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the server's loop (state is only touched there) and return its result."""
        loop = self._loop
        if loop is None or not loop.is_running() or self._thread is threading.current_thread():
            return fn()

        async def call() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(call(), loop).result(HELPER_TIMEOUT)


def wait_for_stop_signal() -> None:
    """Block until SIGINT or SIGTERM (a sandbox command in the foreground), then restore the handlers."""
    stop = threading.Event()
    previous = {
        sig: signal.signal(sig, lambda signum, frame: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        stop.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
