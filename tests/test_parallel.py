"""tests/parallel.py: each xdist worker's Redis database is the configured one plus its index,
whatever form the URL takes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.parallel import worker_redis_url


@pytest.mark.parametrize(
    ("url", "worker", "expected"),
    [
        ("redis://127.0.0.1:6379/9", "gw0", "redis://127.0.0.1:6379/9"),
        ("redis://127.0.0.1:6379/9", "gw3", "redis://127.0.0.1:6379/12"),
        ("redis://:pw@127.0.0.1:6379", "gw1", "redis://:pw@127.0.0.1:6379/1"),
        ("unix:///srv/var/test/redis.sock?db=9", "gw2", "unix:///srv/var/test/redis.sock?db=11"),
        ("unix:///srv/redis.sock", "gw1", "unix:///srv/redis.sock?db=1"),
    ],
)
def test_each_worker_gets_the_next_database(url, worker, expected):
    assert worker_redis_url(url, worker) == expected


@given(db=st.integers(0, 15), index=st.integers(0, 15), socket=st.booleans())
def test_only_the_database_number_changes(db, index, socket):
    import redis.connection

    url = f"unix:///tmp/r.sock?db={db}" if socket else f"redis://:s3cret@10.0.0.1:6380/{db}"
    moved = redis.connection.parse_url(worker_redis_url(url, f"gw{index}"))
    original = redis.connection.parse_url(url)
    assert moved.pop("db") == db + index
    original.pop("db")
    assert moved == original
