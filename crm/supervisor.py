"""A small process supervisor: runs several commands, prefixes their output, stops them together.

Used by `manage.py up` (web + workers + scheduler + embedded Redis) and `manage.py workers
--processes N`. Children get SIGTERM if the supervisor dies (PR_SET_PDEATHSIG), so nothing is
left running after it exits, even when it is killed.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

_COLORS = ["36", "33", "35", "32", "34", "31"]


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


@dataclass
class Proc:
    name: str
    argv: Sequence[str]
    restart: bool = True
    env: dict[str, str] | None = None
    popen: subprocess.Popen | None = field(default=None, repr=False)
    restarts: int = 0
    stop_last: bool = False  # infrastructure (the embedded servers) outlives the processes using it
    stop_signal: int = signal.SIGTERM
    user: str | None = None  # run as this system user (the embedded PostgreSQL under root)


class Supervisor:
    def __init__(self, *, stop_timeout: float = 20.0, exit_when_all_done: bool = False) -> None:
        self.procs: list[Proc] = []
        self.stop_timeout = stop_timeout
        self.exit_when_all_done = exit_when_all_done
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self.width = 10

    def add(
        self,
        name: str,
        argv: Sequence[str],
        *,
        restart: bool = True,
        env: dict[str, str] | None = None,
        stop_last: bool = False,
        stop_signal: int = signal.SIGTERM,
        user: str | None = None,
    ) -> Proc:
        proc = Proc(name, list(argv), restart, env, stop_last=stop_last, stop_signal=stop_signal, user=user)
        self.procs.append(proc)
        self.width = max(self.width, len(name))
        return proc

    def start(self, proc: Proc) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **(proc.env or {})}
        proc.popen = subprocess.Popen(
            proc.argv,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
            start_new_session=True,
            user=proc.user,
            group=proc.user,
            extra_groups=None if proc.user is None else [],
        )
        color = _COLORS[self.procs.index(proc) % len(_COLORS)]
        threading.Thread(target=self._pump, args=(proc, proc.popen, color), daemon=True).start()

    def _pump(self, proc: Proc, popen: subprocess.Popen, color: str) -> None:
        assert popen.stdout is not None
        tty = sys.stdout.isatty()
        prefix = f"{proc.name:<{self.width}} | "
        if tty:
            prefix = f"\033[{color}m{prefix}\033[0m"
        for raw in iter(popen.stdout.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            with self._lock:
                sys.stdout.write(prefix + line + "\n")
                sys.stdout.flush()

    def say(self, message: str) -> None:
        with self._lock:
            sys.stdout.write(f"{'up':<{self.width}} | {message}\n")
            sys.stdout.flush()

    def run(self) -> int:
        """Start everything and wait; returns the exit code. Ctrl-C or SIGTERM stops all."""

        def _signal(signum: int, frame: object) -> None:
            self._stopping.set()

        old = {s: signal.signal(s, _signal) for s in (signal.SIGINT, signal.SIGTERM)}
        code = 0
        try:
            for proc in self.procs:
                if proc.popen is None:
                    self.start(proc)
            while not self._stopping.is_set():
                running = 0
                for proc in self.procs:
                    assert proc.popen is not None
                    rc = proc.popen.poll()
                    if rc is None:
                        running += 1
                        continue
                    if proc.restart and not self._stopping.is_set():
                        self.say(f"{proc.name} exited with {rc}; restarting")
                        proc.restarts += 1
                        time.sleep(min(1.0 * proc.restarts, 5.0))
                        self.start(proc)
                        running += 1
                    elif not self.exit_when_all_done:
                        self.say(f"{proc.name} exited with {rc}; stopping everything")
                        code = rc or 1
                        self._stopping.set()
                        break
                    elif rc:
                        code = rc
                if self.exit_when_all_done and running == 0:
                    break
                self._stopping.wait(0.2)
        finally:
            self.stop()
            for s, handler in old.items():
                signal.signal(s, handler)
        return code

    def stop(self) -> None:
        self._stop([p for p in self.procs if not p.stop_last])
        self._stop([p for p in self.procs if p.stop_last])

    def _stop(self, procs: list[Proc]) -> None:
        alive = [p for p in procs if p.popen is not None and p.popen.poll() is None]
        for proc in alive:
            assert proc.popen is not None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.popen.pid, proc.stop_signal)
        deadline = time.monotonic() + self.stop_timeout
        for proc in alive:
            assert proc.popen is not None
            try:
                proc.popen.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                os.killpg(proc.popen.pid, signal.SIGKILL)
                proc.popen.wait()
