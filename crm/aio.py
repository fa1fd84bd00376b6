"""One asyncio event loop per worker process, in a background thread.

Jobs are synchronous (RQ), but a send job keeps hundreds of HTTP requests in flight; running
them on a loop that outlives the job lets connection pools (keep-alive) serve every job.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_pid: int | None = None


def loop() -> asyncio.AbstractEventLoop:
    global _loop, _pid
    with _lock:
        if _loop is None or _pid != os.getpid() or not _loop.is_running():
            new = asyncio.new_event_loop()
            started = threading.Event()

            def _run() -> None:
                asyncio.set_event_loop(new)
                new.call_soon(started.set)
                new.run_forever()

            threading.Thread(target=_run, name="crm-aio", daemon=True).start()
            started.wait()
            _loop, _pid = new, os.getpid()
        return _loop


def run(coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
    """Run a coroutine on the process's loop and wait for its result."""
    return asyncio.run_coroutine_threadsafe(coro, loop()).result(timeout)


def start(coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
    """Start a coroutine on the process's loop and return at once: the caller goes on with other
    work (a send job claims its next chunk) and takes the result later."""
    return asyncio.run_coroutine_threadsafe(coro, loop())
