"""One asyncio event loop per worker process, in a background thread.

Jobs are synchronous (RQ), but a send job keeps hundreds of HTTP requests in flight; running
them on a loop that outlives the job lets connection pools (keep-alive) serve every job.

At exit the loop closes what was registered with `at_close` (keep-alive sessions) on itself,
finalizes its async generators, stops, and its thread is joined: nothing runs on it while the
interpreter tears down its modules.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import os
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

logger = logging.getLogger(__name__)

CLOSE_TIMEOUT = 5.0  # seconds for the closers, then as long again for the thread to end

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None
_pid: int | None = None
_closers: list[Callable[[], Awaitable[object]]] = []


def loop() -> asyncio.AbstractEventLoop:
    global _loop, _thread, _pid
    with _lock:
        if _loop is None or _pid != os.getpid() or not _loop.is_running():
            new = asyncio.new_event_loop()
            started = threading.Event()

            def _run() -> None:
                asyncio.set_event_loop(new)
                new.call_soon(started.set)
                new.run_forever()

            thread = threading.Thread(target=_run, name="crm-aio", daemon=True)
            thread.start()
            started.wait()
            _closers.clear()  # an earlier loop's (a forked parent's, or one stopped): not this one's
            _loop, _thread, _pid = new, thread, os.getpid()
        return _loop


def run(coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
    """Run a coroutine on the process's loop and wait for its result."""
    return asyncio.run_coroutine_threadsafe(coro, loop()).result(timeout)


def start(coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
    """Start a coroutine on the process's loop and return at once: the caller goes on with other
    work (a send job claims its next chunk) and takes the result later."""
    return asyncio.run_coroutine_threadsafe(coro, loop())


def at_close(closer: Callable[[], Awaitable[object]]) -> None:
    """Await `closer()` on the loop when the process exits, before the loop stops (a session's
    `close`: its connections end cleanly, without "unclosed" warnings). The closer belongs to the
    loop running now (started if need be): a later loop does not inherit it."""
    loop()
    with _lock:
        _closers.append(closer)


@atexit.register
def close() -> None:
    """Close the registered resources, stop the loop and join its thread (a no-op without a loop).
    Bounded: a closer or a thread that does not finish in time is logged and left."""
    global _loop, _thread
    with _lock:
        running, thread = _loop, _thread
        closers = list(reversed(_closers))
        _closers.clear()
        _loop = _thread = None
    if running is None or thread is None or _pid != os.getpid() or not running.is_running():
        return

    async def _close_all() -> None:
        for closer in closers:
            try:
                await closer()
            except Exception:  # one resource failing to close must not keep the others open
                logger.exception("closing %r at exit failed", closer)
        await running.shutdown_asyncgens()

    try:
        asyncio.run_coroutine_threadsafe(_close_all(), running).result(CLOSE_TIMEOUT)
    except (concurrent.futures.TimeoutError, RuntimeError) as exc:
        logger.warning("the event loop's resources did not close at exit: %r", exc)
    running.call_soon_threadsafe(running.stop)
    thread.join(CLOSE_TIMEOUT)
    if thread.is_alive():
        logger.warning("the event loop's thread did not stop at exit")
        return
    running.close()
