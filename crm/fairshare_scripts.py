"""The Lua scripts of the fair queues (crm/fairshare.py), each one atomic in Redis: push a job onto
its tenant's list, pick the next tenant's job in weighted turn, park a tenant, ask whether another
tenant waits ahead, remove a job, drain a queue. Kept apart from the Python that calls them."""

from __future__ import annotations

PARKED_BATCH = 100  # parked tenants a pick re-admits per queue and call (the rest at the next)

# KEYS: ready, tenant list, virtual time, count, wake, weights, parked. ARGV: tenant, job id,
# at_front, wake cap, burst, start. A tenant joining the ready set starts `burst` turns before the
# queue's virtual time: never more (an idle tenant banks nothing beyond it), so it is served at
# once; or at `start` when given (a job that gave its turn: where its tenant stood). A parked
# tenant does not join: the pick re-admits it when its time comes.
PUSH = """
if ARGV[3] == '1' then redis.call('LPUSH', KEYS[2], ARGV[2]) else redis.call('RPUSH', KEYS[2], ARGV[2]) end
redis.call('INCR', KEYS[4])
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) and not redis.call('ZSCORE', KEYS[7], ARGV[1]) then
  local start = tonumber(ARGV[6])
  if not start then start = tonumber(redis.call('GET', KEYS[3]) or '0') - tonumber(ARGV[5]) end
  redis.call('ZADD', KEYS[1], string.format('%.17g', start), ARGV[1])
end
if redis.call('LLEN', KEYS[5]) < tonumber(ARGV[4]) then redis.call('RPUSH', KEYS[5], '1') end
return 1
"""

# KEYS: weights. ARGV: prefix, max stale, burst, now (unix s), then the queue names in priority
# order. Returns {queue, job id, tenant, the tenant's score after this turn} or nil. The id moves to
# RQ's intermediate list in this script. Parked tenants whose time has come rejoin the ready set
# first, at the queue's virtual time (in turn, no newly-ready credit): at most PARKED_BATCH per
# queue and call, so a pick costs what is due, never a pass over the parked.
PICK = (
    """
local P = ARGV[1]
local function stride(t)
  local w = tonumber(redis.call('HGET', KEYS[1], t) or '1') or 1
  if w <= 0 then w = 1 end
  return 1 / w
end
local stale = 0
for i = 5, #ARGV do
  local q = ARGV[i]
  local ready = P .. q .. ':ready'
  local vt = P .. q .. ':vt'
  local plain = 'rq:queue:' .. q
  local parked = P .. q .. ':parked'
  local due = redis.call('ZRANGEBYSCORE', parked, '-inf', ARGV[4], 'LIMIT', 0, """
    + str(PARKED_BATCH)
    + """)
  for _, t in ipairs(due) do
    redis.call('ZREM', parked, t)
    if redis.call('LLEN', P .. q .. ':t:' .. t) > 0 and not redis.call('ZSCORE', ready, t) then
      redis.call('ZADD', ready, redis.call('GET', vt) or '0', t)
    end
  end
  if redis.call('LLEN', plain) > 0 and not redis.call('ZSCORE', ready, '_') then
    local start = tonumber(redis.call('GET', vt) or '0') - tonumber(ARGV[3])
    redis.call('ZADD', ready, string.format('%.17g', start), '_')
  end
  while true do
    local head = redis.call('ZRANGE', ready, 0, 0, 'WITHSCORES')
    if #head == 0 then break end
    local t, score = head[1], tonumber(head[2])
    local src = plain
    if t ~= '_' then src = P .. q .. ':t:' .. t end
    local id = redis.call('LPOP', src)
    if id and t ~= '_' then redis.call('DECR', P .. q .. ':n') end
    local after = string.format('%.17g', score + stride(t))
    if redis.call('LLEN', src) == 0 then
      redis.call('ZREM', ready, t)
    else
      redis.call('ZADD', ready, after, t)
    end
    if score > tonumber(redis.call('GET', vt) or '0') then
      redis.call('SET', vt, string.format('%.17g', score))  -- never backwards (a burst's credit)
    end
    if id then
      -- queued; or a hash without a status (another writer's, maybe unreadable: the worker fails
      -- it with the reason). Deleted (no hash) and canceled ids are skipped.
      local st = redis.call('HGET', 'rq:job:' .. id, 'status')
      if st == 'queued' or (not st and redis.call('EXISTS', 'rq:job:' .. id) == 1) then
        redis.call('RPUSH', plain .. ':intermediate', id)
        return {q, id, t, after}
      end
      stale = stale + 1
      if stale >= tonumber(ARGV[2]) then return nil end
    end
  end
end
return nil
"""
)

# KEYS: ready, tenant list, count, parked. ARGV: tenant, job id, until (unix s). The job goes back
# to the head of its tenant's list and the tenant leaves the ready set until `until`.
PARK = """
redis.call('LPUSH', KEYS[2], ARGV[2])
redis.call('INCR', KEYS[3])
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[4], ARGV[3], ARGV[1])
return 1
"""

# KEYS: ready, virtual time, RQ's list, then the ready set and RQ's list of each queue the worker
# serves before this one. ARGV: tenant, burst, its score after its last turn. 1 when the next pick
# would serve another tenant before `tenant` (at its score in the ready set, or where a job it gives
# back rejoins when it has nothing else waiting: `push_yielded`; the plain list joins at its pick's
# credit), or any work of a queue before this one (priorities keep their meaning while a long job
# runs: its next chunk waits for a webhook or a campaign's trigger, of any tenant).
AHEAD = """
for i = 4, #KEYS, 2 do
  if redis.call('ZCARD', KEYS[i]) > 0 or redis.call('LLEN', KEYS[i + 1]) > 0 then return 1 end
end
local vt = tonumber(redis.call('GET', KEYS[2]) or '0')
local own = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]) or ARGV[3])
if not own then own = vt end
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if #head > 0 and head[1] ~= ARGV[1] and tonumber(head[2]) < own then return 1 end
if ARGV[1] ~= '_' and not redis.call('ZSCORE', KEYS[1], '_') and redis.call('LLEN', KEYS[3]) > 0
   and vt - tonumber(ARGV[2]) < own then
  return 1
end
return 0
"""

# KEYS: ready, tenant list, count, parked. ARGV: tenant, job id. Removes the id from the tenant's
# list.
REMOVE = """
local n = redis.call('LREM', KEYS[2], 1, ARGV[2])
if n > 0 then
  redis.call('DECRBY', KEYS[3], n)
  if redis.call('LLEN', KEYS[2]) == 0 then
    redis.call('ZREM', KEYS[1], ARGV[1])
    redis.call('ZREM', KEYS[4], ARGV[1])
  end
end
return n
"""

# KEYS: ready, tenant list, count, parked. ARGV: how many, job key prefix, tenant. Pops up to
# ARGV[1] ids of one tenant and deletes their jobs (the queue page's "empty").
DRAIN = """
local ids = redis.call('LPOP', KEYS[2], tonumber(ARGV[1]))
if not ids then
  redis.call('ZREM', KEYS[1], ARGV[3])
  redis.call('ZREM', KEYS[4], ARGV[3])
  return 0
end
for _, id in ipairs(ids) do
  redis.call('DEL', ARGV[2] .. id, ARGV[2] .. id .. ':dependents', ARGV[2] .. id .. ':dependencies',
             'rq:results:' .. id)
end
redis.call('DECRBY', KEYS[3], #ids)
if redis.call('LLEN', KEYS[2]) == 0 then
  redis.call('ZREM', KEYS[1], ARGV[3])
  redis.call('ZREM', KEYS[4], ARGV[3])
end
return #ids
"""
