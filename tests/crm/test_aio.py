"""The process's event loop ends with the process: its resources closed, its thread joined before the
interpreter finalizes (a daemon thread left polling then could keep a stopped worker alive)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.conftest import ROOT

PROGRAM = textwrap.dedent(
    """
    import asyncio, atexit, sys, threading

    def after_the_loop():  # registered before crm.aio: runs after its close (atexit is LIFO)
        alive = [t.name for t in threading.enumerate() if t.name == "crm-aio"]
        print("threads left:", alive, flush=True)

    atexit.register(after_the_loop)

    from crm import aio

    async def closer(name):
        await asyncio.sleep(0)
        print("closed", name, flush=True)

    async def failing():
        raise OSError("a resource that cannot close")

    async def hanging_generator():
        try:
            yield 1
            await asyncio.sleep(3600)
        finally:
            print("generator finalized", flush=True)

    async def start_generator():
        agen = hanging_generator()
        await agen.__anext__()
        return agen

    aio.at_close(lambda: closer("first"))
    aio.at_close(failing)
    aio.at_close(lambda: closer("last"))
    kept = aio.run(start_generator())
    print("loop running:", aio.loop().is_running(), flush=True)
    """
)


def test_at_exit_every_closer_runs_newest_first_even_after_one_fails_and_the_thread_is_joined():
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "loop running: True",
        "closed last",
        "closed first",
        "generator finalized",
        "threads left: []",
    ]
    assert "a resource that cannot close" in done.stderr  # logged, not swallowed silently


def test_a_process_that_never_started_the_loop_exits_without_one():
    program = "from crm import aio; import threading; print(aio.close(), threading.active_count())"
    done = subprocess.run(
        [sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["None", "1"]
