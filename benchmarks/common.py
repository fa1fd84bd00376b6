"""What the benchmark scripts share (import it after django.setup())."""

from __future__ import annotations

import os
import time


def ensure_database() -> None:
    """Create the database DATABASE_URL names when it does not exist, then migrate it."""
    import django.db
    import psycopg
    from django.core.management import call_command
    from django.db import connection

    settings_db = connection.settings_dict
    try:
        connection.ensure_connection()
    except django.db.OperationalError:
        with psycopg.connect(
            host=settings_db["HOST"],
            port=settings_db["PORT"],
            user=settings_db["USER"],
            dbname="postgres",
            autocommit=True,
        ) as admin:
            admin.execute(f'CREATE DATABASE "{settings_db["NAME"]}"')
    call_command("migrate", verbosity=0)


class CpuAccount:
    """CPU seconds spent by each part of a benchmark between `start()` and `stop()`, from /proc
    (Linux): each named process tree (e.g. `web`: the web server's process and its children), the
    PostgreSQL backends serving the benchmark's database (PostgreSQL titles each with its
    database's name), `client` (this process) and `other` (everything else on the machine, e.g.
    another job). Shows where a request's cost goes; on a shared machine, read with `other`."""

    def __init__(self, *, trees: dict[str, int], database: str) -> None:
        self.trees = trees
        self.database = f" {database} "
        self.before: dict[int, tuple[str, float]] = {}
        self.started = 0.0

    def _sample(self) -> dict[int, tuple[str, float]]:
        tick = os.sysconf("SC_CLK_TCK")
        parents: dict[int, int] = {}
        times: dict[int, float] = {}
        titles: dict[int, str] = {}
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
                with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                    titles[int(entry.name)] = f.read().replace(b"\0", b" ").decode(errors="replace") + " "
            except OSError:  # gone meanwhile
                continue
            pid = int(entry.name)
            parents[pid] = int(fields[1])
            times[pid] = (int(fields[11]) + int(fields[12])) / tick  # utime + stime
        roots = {pid: name for name, pid in self.trees.items()}
        me = os.getpid()

        def part(pid: int) -> str:
            if pid == me:
                return "client"
            if titles.get(pid, "").startswith("postgres:") and self.database in titles[pid]:
                return "postgres"
            seen = 0
            while pid > 1 and seen < 64:
                if pid in roots:
                    return roots[pid]
                pid, seen = parents.get(pid, 0), seen + 1
            return "other"

        return {pid: (part(pid), seconds) for pid, seconds in times.items()}

    def start(self) -> None:
        self.before = self._sample()
        self.started = time.monotonic()

    def stop(self) -> dict[str, float]:
        """CPU seconds per part since start() (processes started meanwhile count whole), and
        `wall`: the seconds elapsed."""
        spent = dict.fromkeys([*self.trees, "postgres", "client", "other"], 0.0)
        for pid, (part, seconds) in self._sample().items():
            earlier = self.before.get(pid)
            spent[part] += seconds - (earlier[1] if earlier and earlier[0] == part else 0.0)
        spent["wall"] = time.monotonic() - self.started
        return spent

    def per_request(self, spent: dict[str, float], requests: int) -> str:
        """`web 0.21 ms, postgres 0.10 ms, …` of CPU per request, and the machine's other load."""
        each = max(requests, 1) / 1000
        parts = ", ".join(
            f"{name} {spent[name] / each:.2f} ms" for name in [*self.trees, "postgres", "client"]
        )
        return f"CPU per request: {parts} (other processes: {spent['other'] / spent['wall']:.1f} cores)"
