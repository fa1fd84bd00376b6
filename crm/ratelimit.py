"""Pacing shared by every worker on every machine: a schedule of send times kept in Redis.

`reserve(key, n, per_second)` books n consecutive slots at `per_second` and returns when the
first one starts (seconds from now) and the interval between them. One round trip for a whole
chunk; the schedule survives restarts and retries, and holds across processes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from crm.jobs import get_connection

# KEYS[1] = schedule key; ARGV[1] = n, ARGV[2] = interval (s), ARGV[3] = a horizon (s, negative =
# none): only the slots that start within it are booked. Uses Redis's clock, so every machine agrees.
# Returns "<slots booked> <the first one's start relative to now>" (with none booked: when the next
# free slot starts).
_RESERVE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local n = tonumber(ARGV[1])
local interval = tonumber(ARGV[2])
local horizon = tonumber(ARGV[3])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end
local start = tat - now
if horizon >= 0 then
  if start > horizon then return '0 ' .. tostring(start) end
  n = math.min(n, math.floor((horizon - start) / interval) + 1)
end
local new_tat = tat + n * interval
redis.call('SET', KEYS[1], tostring(new_tat), 'EX', math.ceil(new_tat - now) + 60)
return tostring(n) .. ' ' .. tostring(start)
"""


@dataclass(frozen=True)
class Slots:
    start: float  # seconds from now until the first slot
    interval: float  # seconds between consecutive slots
    count: int | None = None  # slots booked; None: all that were asked for

    def offset(self, i: int) -> float:
        return self.start + i * self.interval

    def booked(self, n: int) -> int:
        """How many of the n slots asked for were booked."""
        return n if self.count is None else self.count

    @property
    def free_in(self) -> float:
        """Seconds until the slot after the booked ones starts (when more can be booked)."""
        return self.start + (self.count or 0) * self.interval


def reserve(key: str, n: int, per_second: float, *, within: float | None = None) -> Slots:
    """Book n slots at `per_second` (0 = unpaced: every slot starts now).

    `within`: book only the slots that start within that many seconds (`count` says how many,
    maybe none): a caller that would sleep longer lets the rest wait, and its worker serve others."""
    if per_second <= 0 or n <= 0:
        return Slots(0.0, 0.0)
    connection = get_connection()
    script = connection.register_script(_RESERVE)
    interval = 1.0 / per_second
    horizon = -1.0 if within is None else within
    raw = script(keys=[f"crm:pace:{key}"], args=[n, repr(interval), repr(horizon)])
    booked, start = (raw.decode() if isinstance(raw, bytes) else str(raw)).split()
    return Slots(float(start), interval, None if within is None else int(booked))


def free_in(keys: Sequence[str]) -> list[float]:
    """Seconds from now until each schedule's next free slot (0: free now), by Redis's clock, in
    one round trip: what a caller weighs before booking several schedules. Read only."""
    if not keys:
        return []
    pipe = get_connection().pipeline(transaction=False)
    pipe.time()
    pipe.mget([f"crm:pace:{key}" for key in keys])
    (seconds, micros), booked = pipe.execute()
    now = seconds + micros / 1_000_000
    return [max(0.0, float(tat) - now) if tat else 0.0 for tat in booked]
