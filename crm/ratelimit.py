"""Pacing shared by every worker on every machine: a schedule of send times kept in Redis.

`reserve(key, n, per_second)` books n consecutive slots at `per_second` and returns when the
first one starts (seconds from now) and the interval between them. One round trip for a whole
chunk; the schedule survives restarts and retries, and holds across processes.
"""

from __future__ import annotations

from dataclasses import dataclass

from crm.jobs import get_connection

# KEYS[1] = schedule key; ARGV[1] = n, ARGV[2] = interval (s). Uses Redis's clock, so every
# machine agrees. Returns the first slot's start relative to now, as a string.
_RESERVE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local n = tonumber(ARGV[1])
local interval = tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end
local start = tat - now
local new_tat = tat + n * interval
redis.call('SET', KEYS[1], tostring(new_tat), 'EX', math.ceil(new_tat - now) + 60)
return tostring(start)
"""


@dataclass(frozen=True)
class Slots:
    start: float  # seconds from now until the first slot
    interval: float  # seconds between consecutive slots

    def offset(self, i: int) -> float:
        return self.start + i * self.interval


def reserve(key: str, n: int, per_second: float) -> Slots:
    """Book n slots at `per_second` (0 = unpaced: every slot starts now)."""
    if per_second <= 0 or n <= 0:
        return Slots(0.0, 0.0)
    connection = get_connection()
    script = connection.register_script(_RESERVE)
    interval = 1.0 / per_second
    start = float(script(keys=[f"crm:pace:{key}"], args=[n, repr(interval)]))
    return Slots(start, interval)
