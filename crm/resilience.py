"""Resilience primitives on Redis (the integration runner's), in two scripts (one round trip each per job):

`admit` decides, atomically and with Redis's clock, whether a job may call its handler now:
circuit breaker per integration (closed / open / half-open with a bounded number of probes),
concurrency per handler (a semaphore of leases that expire, so a dead worker frees its slot
after at most one lease), and sliding windows per tenant and per handler (sorted sets trimmed on
every call, expiring when idle). `finish` releases the slot and records the call's outcome in the
breaker. Plain values in, plain values out: the runner app decides what to do with a refusal.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass

from redis import Redis

logger = logging.getLogger(__name__)

WINDOW_MS = 60_000


@dataclass(frozen=True)
class BreakerPolicy:
    failures: int = 5  # consecutive failures that open a closed circuit
    open_ms: int = 30_000  # how long it stays open before a half-open probe
    successes: int = 2  # probe successes that close a half-open circuit
    probes: int = 1  # probes in flight at once while half-open
    probe_lease_ms: int = 60_000


# Refusal reasons, as `admit` returns them.
ADMITTED, CIRCUIT_OPEN, HALF_OPEN_BUSY, TENANT_LIMIT, HANDLER_LIMIT, CONCURRENCY = range(6)
REASONS = {
    CIRCUIT_OPEN: "circuit open",
    HALF_OPEN_BUSY: "circuit half-open, probe in flight",
    TENANT_LIMIT: "tenant rate limit",
    HANDLER_LIMIT: "handler rate limit",
    CONCURRENCY: "handler concurrency",
}

# KEYS: 1 breaker hash, 2 probe zset, 3 tenant window, 4 handler window, 5 semaphore
# ARGV: 1 token, 2 n, 3 tenant limit, 4 handler limit (0 none), 5 concurrency, 6 lease ms,
#       7 max probes, 8 window ms, 9 probe lease ms, 10 partial (1: admit the first k <= n items
#       the windows still have room for, and only one while half-open; 0: all n or none)
# Returns {code, wait ms, probe, k admitted}; with partial, wait is how long the rest should wait.
_ADMIT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local token = ARGV[1]
local probe = 0
local st = redis.call('HMGET', KEYS[1], 'state', 'until')
local state = st[1] or 'closed'
if state == 'open' then
  local untl = tonumber(st[2] or '0')
  if now < untl then return {1, untl - now, 0, 0} end
  redis.call('HSET', KEYS[1], 'state', 'half', 'successes', 0)
  state = 'half'
end
if state == 'half' then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[7]) then return {2, 1000, 0, 0} end
  probe = 1
end
local lease = tonumber(ARGV[6])
redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now)
if redis.call('ZCARD', KEYS[5]) >= tonumber(ARGV[5]) then return {5, 1000, 0, 0} end
local n = tonumber(ARGV[2])
local partial = tonumber(ARGV[10] or '0') == 1
local rest_wait = 0
if partial and probe == 1 and n > 1 then n = 1; rest_wait = 1000 end
local window = tonumber(ARGV[8])
local tl = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now - window)
local tc = redis.call('ZCARD', KEYS[3])
if partial and tc + n > tl and tl - tc >= 1 then n = tl - tc; rest_wait = 5000 end
if tc > 0 and tc + n > tl then return {3, 5000, 0, 0} end
local hl = tonumber(ARGV[4])
if hl > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now - window)
  local hc = redis.call('ZCARD', KEYS[4])
  local function oldest_wait()
    local oldest = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')
    if oldest[2] == nil then return window end
    return math.max(tonumber(oldest[2]) + window - now, 100)
  end
  if partial and hc + n > hl and hl - hc >= 1 then
    n = hl - hc
    rest_wait = math.max(rest_wait, hc > 0 and oldest_wait() or window)
  end
  if hc > 0 and hc + n > hl then return {4, oldest_wait(), 0, 0} end
end
for i = 1, n do
  redis.call('ZADD', KEYS[3], now, token .. ':' .. i)
  if hl > 0 then redis.call('ZADD', KEYS[4], now, token .. ':' .. i) end
end
redis.call('PEXPIRE', KEYS[3], window)
if hl > 0 then redis.call('PEXPIRE', KEYS[4], window) end
redis.call('ZADD', KEYS[5], now + lease, token)
redis.call('PEXPIRE', KEYS[5], lease * 2)
if probe == 1 then
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[9]), token)
  redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[9]) * 2)
end
return {0, rest_wait, probe, n}
"""

# KEYS: 1 breaker hash, 2 probe zset, 3 semaphore
# ARGV: 1 token, 2 outcome (success|failure|none), 3 failures to open, 4 open ms, 5 successes to close
_FINISH = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREM', KEYS[3], ARGV[1])
local was_probe = redis.call('ZREM', KEYS[2], ARGV[1])
local outcome = ARGV[2]
local state = redis.call('HGET', KEYS[1], 'state') or 'closed'
local function open()
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], 'state', 'open', 'until', now + tonumber(ARGV[4]), 'opened_at', now)
  return 'open'
end
if outcome == 'success' then
  if state == 'half' and was_probe == 1 then
    if redis.call('HINCRBY', KEYS[1], 'successes', 1) >= tonumber(ARGV[5]) then
      redis.call('DEL', KEYS[1])
      return 'closed'
    end
  elseif state == 'closed' and redis.call('EXISTS', KEYS[1]) == 1 then
    redis.call('DEL', KEYS[1])
  end
elseif outcome == 'failure' then
  if state == 'half' and was_probe == 1 then return open() end
  if state == 'closed' then
    local f = redis.call('HINCRBY', KEYS[1], 'failures', 1)
    if f >= tonumber(ARGV[3]) then return open() end
    redis.call('PEXPIRE', KEYS[1], 600000)
  end
end
return state
"""


def breaker_key(integration_key: str) -> str:
    return f"runner:cb:{integration_key}"


def semaphore_key(handler_id: int) -> str:
    return f"runner:sem:{handler_id}"


def tenant_window_key(organization_id: int) -> str:
    return f"runner:rate:org:{organization_id}"


def handler_window_key(handler_id: int) -> str:
    return f"runner:rate:handler:{handler_id}"


@dataclass(frozen=True)
class Admission:
    admitted: bool
    code: int
    wait: float  # seconds to wait before asking again (refusals)
    probe: bool  # this call is a half-open probe
    token: str
    count: int = 0  # items admitted (partial admission: maybe fewer than asked; wait is for the rest)

    @property
    def reason(self) -> str:
        return REASONS.get(self.code, "")


class Gate:
    """The two scripts bound to a connection; one per process is enough."""

    def __init__(self, connection: Redis) -> None:
        self.connection = connection
        self._admit = connection.register_script(_ADMIT)
        self._finish = connection.register_script(_FINISH)
        self._held: dict[str, tuple[str, str, int]] = {}  # token -> (semaphore, probes, lease ms)
        self._held_lock = threading.Lock()
        self._renewer: threading.Thread | None = None

    def admit(
        self,
        *,
        integration_key: str,
        handler_id: int,
        organization_id: int,
        n: int = 1,
        tenant_limit: int,
        handler_limit: int = 0,
        concurrency: int,
        lease_ms: int = 60_000,
        window_ms: int = WINDOW_MS,
        policy: BreakerPolicy | None = None,
        partial: bool = False,
    ) -> Admission:
        """Admit n items for one handler call, or say why not and for how long to wait.

        partial=True (a group of single-item calls): admit the first k <= n items that the windows
        still have room for (one while half-open: the probe); `count` says how many."""
        policy = policy or BreakerPolicy()
        token = uuid.uuid4().hex
        bkey = breaker_key(integration_key)
        code, wait_ms, probe, count = self._admit(
            keys=[
                bkey,
                bkey + ":probes",
                tenant_window_key(organization_id),
                handler_window_key(handler_id),
                semaphore_key(handler_id),
            ],
            args=[
                token,
                n,
                tenant_limit,
                handler_limit,
                concurrency,
                lease_ms,
                policy.probes,
                window_ms,
                policy.probe_lease_ms,
                1 if partial else 0,
            ],
        )
        admission = Admission(
            code == ADMITTED, int(code), int(wait_ms) / 1000, bool(probe), token, int(count)
        )
        if admission.admitted:
            self._hold(token, semaphore_key(handler_id), bkey + ":probes", lease_ms)
        return admission

    def finish(
        self,
        admission: Admission,
        *,
        integration_key: str,
        handler_id: int,
        outcome: str,
        policy: BreakerPolicy | None = None,
    ) -> str:
        """Release the slot; outcome success|failure|none feeds the breaker. Returns its state."""
        policy = policy or BreakerPolicy()
        with self._held_lock:
            self._held.pop(admission.token, None)
        bkey = breaker_key(integration_key)
        state = self._finish(
            keys=[bkey, bkey + ":probes", semaphore_key(handler_id)],
            args=[admission.token, outcome, policy.failures, policy.open_ms, policy.successes],
        )
        return state.decode() if isinstance(state, bytes) else str(state)

    # A call longer than its lease keeps its slot: one thread per process extends every lease held.
    def _hold(self, token: str, sem: str, probes: str, lease_ms: int) -> None:
        with self._held_lock:
            self._held[token] = (sem, probes, lease_ms)
            if self._renewer is None or not self._renewer.is_alive():
                self._renewer = threading.Thread(target=self._renew_loop, name="runner-leases", daemon=True)
                self._renewer.start()

    def _renew_loop(self) -> None:

        while True:
            time.sleep(5)
            with self._held_lock:
                held = list(self._held.items())
            if not held:
                continue
            try:
                now_s, now_us = self.connection.time()
                now_ms = now_s * 1000 + now_us // 1000
                with self.connection.pipeline(transaction=False) as pipe:
                    for token, (sem, probes, lease_ms) in held:
                        pipe.zadd(sem, {token: now_ms + lease_ms}, xx=True)
                        pipe.zadd(probes, {token: now_ms + lease_ms}, xx=True)
                    pipe.execute()
            except Exception:  # a missed renewal only shortens a lease; try again next round
                logger.warning("renewing runner leases failed", exc_info=True)

    def breaker_state(self, integration_key: str) -> dict[str, str | int]:
        """{state: closed|open|half, failures, successes, open_for (s)}: one breaker's `snapshot`."""
        view = snapshot(
            self.connection, integration_keys=[integration_key], handler_ids=[], organization_ids=[]
        ).breakers[integration_key]
        return {
            "state": view.state,
            "failures": view.failures,
            "successes": view.successes,
            "open_for": view.open_for,
        }

    def breaker_reset(self, integration_key: str) -> None:
        key = breaker_key(integration_key)
        self.connection.delete(key, key + ":probes")


# --- read-only views for the operator's dashboard (never change a key) ---------------------------

# KEYS: the breaker hashes (nb), then per handler its semaphore and its rate window (2 per handler), then
#       the tenant windows. ARGV: 1 nb, 2 nh, 3 window ms.
# Returns {now ms, {breaker fields…, 'probes', n} per breaker, {in flight, rate used} per handler,
#          used per tenant}.
_SNAPSHOT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local nb = tonumber(ARGV[1])
local nh = tonumber(ARGV[2])
local since = '(' .. (now - tonumber(ARGV[3]))
local out = {now}
for i = 1, nb do
  local fields = redis.call('HGETALL', KEYS[i])
  fields[#fields + 1] = 'probes'
  fields[#fields + 1] = tostring(redis.call('ZCOUNT', KEYS[i] .. ':probes', '(' .. now, '+inf'))
  out[#out + 1] = fields
end
for i = nb + 1, nb + 2 * nh, 2 do
  local held = redis.call('ZCOUNT', KEYS[i], '(' .. now, '+inf')
  out[#out + 1] = {held, redis.call('ZCOUNT', KEYS[i + 1], since, '+inf')}
end
for i = nb + 2 * nh + 1, #KEYS do
  out[#out + 1] = redis.call('ZCOUNT', KEYS[i], since, '+inf')
end
return out
"""


@dataclass(frozen=True)
class BreakerView:
    state: str  # closed | open | half (an open circuit past its time is reported half-open)
    failures: int = 0  # consecutive failures counted while closed
    successes: int = 0  # probe successes while half-open
    probes: int = 0  # probes in flight while half-open
    open_for: int = 0  # seconds until the half-open probe (open only)


@dataclass(frozen=True)
class Snapshot:
    breakers: dict[str, BreakerView]  # by integration key
    in_flight: dict[int, int]  # leases held now, by handler id
    handler_used: dict[int, int]  # items admitted in the last window, by handler id
    tenant_used: dict[int, int]  # items admitted in the last window, by organization id


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _breaker_view(now_ms: int, flat: list[bytes | str]) -> BreakerView:
    data = {_text(flat[i]): _text(flat[i + 1]) for i in range(0, len(flat) - 1, 2)}
    state = data.get("state", "closed")
    open_for = 0
    if state == "open":
        remaining = int(data.get("until", 0)) - now_ms
        if remaining <= 0:
            state = "half"  # the next admission turns it half-open
        open_for = -(-max(remaining, 0) // 1000)
    return BreakerView(
        state=state,
        failures=int(data.get("failures", 0)),
        successes=int(data.get("successes", 0)),
        probes=int(data.get("probes", 0)) if state == "half" else 0,
        open_for=open_for,
    )


def snapshot(
    connection: Redis,
    *,
    integration_keys: list[str],
    handler_ids: list[int],
    organization_ids: list[int],
    window_ms: int = WINDOW_MS,
) -> Snapshot:
    """Breakers, leases held and window counts of many integrations, handlers and tenants, read in
    one round trip with Redis's clock (the clock `admit` uses). Reads only."""
    keys = [breaker_key(k) for k in integration_keys]
    for handler_id in handler_ids:
        keys += [semaphore_key(handler_id), handler_window_key(handler_id)]
    keys += [tenant_window_key(o) for o in organization_ids]
    if not keys:
        return Snapshot({}, {}, {}, {})
    reply = connection.register_script(_SNAPSHOT)(
        keys=keys, args=[len(integration_keys), len(handler_ids), window_ms]
    )
    now_ms = int(reply[0])
    nb, nh = len(integration_keys), len(handler_ids)
    handlers = reply[1 + nb : 1 + nb + nh]
    return Snapshot(
        breakers={k: _breaker_view(now_ms, reply[1 + i]) for i, k in enumerate(integration_keys)},
        in_flight={h: int(handlers[i][0]) for i, h in enumerate(handler_ids)},
        handler_used={h: int(handlers[i][1]) for i, h in enumerate(handler_ids)},
        tenant_used={o: int(reply[1 + nb + nh + i]) for i, o in enumerate(organization_ids)},
    )
