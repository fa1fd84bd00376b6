"""Loaded with `-p tests.parallel`, before pytest-django reads the settings: under pytest-xdist
each worker process gets a Redis database of its own (REDIS_URL's database + the worker's index),
since every test flushes its Redis database. pytest-django already gives each worker a PostgreSQL
test database of its own (`test_<name>_gw<N>`)."""

from __future__ import annotations

import os
import urllib.parse


def worker_redis_url(url: str, worker: str) -> str:
    """`url` with its database moved up by the xdist worker's index (`gw2` → +2)."""
    index = int(worker.removeprefix("gw"))
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "unix":  # unix:///path/redis.sock?db=9 (urlunsplit would drop the empty host)
        query = dict(urllib.parse.parse_qsl(parts.query))
        query["db"] = str(int(query.get("db", "0")) + index)
        return f"unix://{parts.netloc}{parts.path}?{urllib.parse.urlencode(query)}"
    db = int(parts.path.strip("/") or "0")
    return urllib.parse.urlunsplit(parts._replace(path=f"/{db + index}"))


_worker = os.environ.get("PYTEST_XDIST_WORKER")
if _worker:
    for _name in ("REDIS_URL", "TEST_REDIS_URL"):
        if os.environ.get(_name):
            os.environ[_name] = worker_redis_url(os.environ[_name], _worker)
