from __future__ import annotations

import pytest

from crm import ratelimit


def test_consecutive_reservations_queue_up_behind_each_other():
    first = ratelimit.reserve("wa:1", 10, 5)
    assert first.start == pytest.approx(0, abs=0.05)
    assert first.interval == pytest.approx(0.2)
    assert first.offset(9) == pytest.approx(1.8, abs=0.05)
    second = ratelimit.reserve("wa:1", 10, 5)  # another worker, right after
    assert second.start == pytest.approx(2.0, abs=0.05)
    other = ratelimit.reserve("wa:2", 10, 5)  # another number is not held up
    assert other.start == pytest.approx(0, abs=0.05)


def test_zero_means_unpaced():
    slots = ratelimit.reserve("wa:3", 1000, 0)
    assert (slots.start, slots.offset(999)) == (0.0, 0.0)


def test_free_in_reads_when_each_schedule_frees_without_booking(redis_db):
    ratelimit.reserve("wa:4", 10, 5)  # booked for the next 2 s
    booked, free = ratelimit.free_in(["wa:4", "wa:5"])
    assert 0 < booked <= 2.0 and free == 0.0
    assert ratelimit.reserve("wa:4", 1, 5).start <= booked  # reading it booked nothing
    assert ratelimit.free_in([]) == []
