"""Lua scripts of the Redis JobQueue. Each runs atomically inside Redis.

ARGV[1] of every script is the key prefix P (a hash tag such as "{llmq}", so
all keys share one slot). Keys:

  P:jobs               hash  request id -> job JSON (queued or leased)
  P:loc                hash  request id -> "q\tMODEL\tTIER\tTENANT\tENQUEUED_AT" or "l\tWORKER"
  P:q:M:T:N            list  tenant N's FIFO sub-queue of request ids in (model M, tier T)
  P:ring:M:T           list  tenants of (M, T) with queued jobs, in round-robin order
  P:depth:M            hash  tier -> queued jobs of model M
  P:lease:W            hash  request id -> "0|1\tMODEL\tTIER\tTENANT\tENQUEUED_AT" (started flag first)
  P:cancel:W           set   request ids worker W must abort
  P:dropped:M          list  job JSON cancelled while queued, to be ended by a worker of M
  P:workers            hash  worker id -> model (every worker not yet reaped or unregistered)
  P:hb:W               string heartbeat payload, expires after the heartbeat timeout
  P:reaped:W           string set when W was reaped; its next heartbeat reports it
  P:orphans            list  "WORKER\tJOB JSON" of started jobs taken from dead workers
  P:wake:M             list  wake-up tokens for idle workers of model M (BLPOP)

Model names may contain ':' but tiers and tenants (slug, integer id) may not,
so the keys stay unambiguous; no name may contain a tab (Job checks).
"""

ENQUEUE = r"""
local P, rid, job, m, t, n, e, maxd = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], tonumber(ARGV[8])
if redis.call('HEXISTS', P..':loc', rid) == 1 then return -1 end
local depth = tonumber(redis.call('HGET', P..':depth:'..m, t) or '0')
if maxd > 0 and depth >= maxd then return 0 end
redis.call('HSET', P..':jobs', rid, job)
redis.call('HSET', P..':loc', rid, 'q\t'..m..'\t'..t..'\t'..n..'\t'..e)
local q = P..':q:'..m..':'..t..':'..n
if redis.call('RPUSH', q, rid) == 1 then redis.call('RPUSH', P..':ring:'..m..':'..t, n) end
redis.call('HINCRBY', P..':depth:'..m, t, 1)
redis.call('RPUSH', P..':wake:'..m, '1')
redis.call('LTRIM', P..':wake:'..m, -64, -1)
return 1
"""

# ARGV: P, model, worker, tier, tier, ... (the selector's plan)
LEASE = r"""
local P, m, w = ARGV[1], ARGV[2], ARGV[3]
if redis.call('EXISTS', P..':reaped:'..w) == 1 then return {} end
local out = {}
for i = 4, #ARGV do
  local t = ARGV[i]
  local ring = P..':ring:'..m..':'..t
  local n = redis.call('LPOP', ring)
  if n then
    local q = P..':q:'..m..':'..t..':'..n
    local rid = redis.call('LPOP', q)
    if redis.call('LLEN', q) > 0 then redis.call('RPUSH', ring, n) end
    if rid then
      local loc = redis.call('HGET', P..':loc', rid)
      if redis.call('HINCRBY', P..':depth:'..m, t, -1) <= 0 then redis.call('HDEL', P..':depth:'..m, t) end
      redis.call('HSET', P..':loc', rid, 'l\t'..w)
      redis.call('HSET', P..':lease:'..w, rid, '0'..string.sub(loc, 2))
      out[#out + 1] = redis.call('HGET', P..':jobs', rid)
    end
  end
end
if #out > 0 then redis.call('HSET', P..':workers', w, m) end
return out
"""

CANCEL = r"""
local P, rid = ARGV[1], ARGV[2]
local loc = redis.call('HGET', P..':loc', rid)
if not loc then return 'unknown' end
if string.sub(loc, 1, 1) == 'q' then
  local m, t, n = string.match(loc, '^q\t([^\t]*)\t([^\t]*)\t([^\t]*)\t')
  local q = P..':q:'..m..':'..t..':'..n
  redis.call('LREM', q, 1, rid)
  if redis.call('LLEN', q) == 0 then redis.call('LREM', P..':ring:'..m..':'..t, 0, n) end
  if redis.call('HINCRBY', P..':depth:'..m, t, -1) <= 0 then redis.call('HDEL', P..':depth:'..m, t) end
  local job = redis.call('HGET', P..':jobs', rid)
  redis.call('HDEL', P..':jobs', rid)
  redis.call('HDEL', P..':loc', rid)
  redis.call('RPUSH', P..':dropped:'..m, job)
  redis.call('RPUSH', P..':wake:'..m, '1')
  redis.call('LTRIM', P..':wake:'..m, -64, -1)
  return 'dropped'
end
redis.call('SADD', P..':cancel:'..string.sub(loc, 3), rid)
return 'signalled'
"""

# ARGV: P, worker, request id, ...; returns the ids still leased to the worker.
MARK_STARTED = r"""
local P, w = ARGV[1], ARGV[2]
local h = P..':lease:'..w
local out = {}
for i = 3, #ARGV do
  local v = redis.call('HGET', h, ARGV[i])
  if v then
    if string.sub(v, 1, 1) == '0' then redis.call('HSET', h, ARGV[i], '1'..string.sub(v, 2)) end
    out[#out + 1] = ARGV[i]
  end
end
return out
"""

# ARGV: P, worker, request id, ...; the ids whose leases this worker still held, released.
COMPLETE = r"""
local P, w = ARGV[1], ARGV[2]
local out = {}
for i = 3, #ARGV do
  local rid = ARGV[i]
  if redis.call('HDEL', P..':lease:'..w, rid) == 1 then
    redis.call('HDEL', P..':jobs', rid)
    redis.call('HDEL', P..':loc', rid)
    redis.call('SREM', P..':cancel:'..w, rid)
    out[#out + 1] = rid
  end
end
return out
"""

# ARGV: P, worker[, model]; the worker's cancelled ids, cleared.
_TAKE_CANCELS = r"""
local key = ARGV[1]..':cancel:'..ARGV[2]
local ids = redis.call('SMEMBERS', key)
redis.call('DEL', key)
"""
TAKE_CANCELS = _TAKE_CANCELS + "return ids\n"
# ...and with them the model's depth hash, flat: {ids, {tier, count, ...}} (a worker's ask before each step).
TAKE_CANCELS_AND_DEPTHS = _TAKE_CANCELS + "return {ids, redis.call('HGETALL', ARGV[1]..':depth:'..ARGV[3])}\n"

TAKE_DROPPED = r"""
local key = ARGV[1]..':dropped:'..ARGV[2]
local n = tonumber(ARGV[3])
local jobs = redis.call('LRANGE', key, 0, n - 1)
redis.call('LTRIM', key, n, -1)
return jobs
"""

# ARGV: P, worker, model, payload JSON, ttl ms; returns 1 if the worker had been reaped.
HEARTBEAT = r"""
local P, w = ARGV[1], ARGV[2]
local reaped = redis.call('DEL', P..':reaped:'..w)
redis.call('SET', P..':hb:'..w, ARGV[4], 'PX', tonumber(ARGV[5]))
redis.call('HSET', P..':workers', w, ARGV[3])
return reaped
"""

# ARGV: P, worker, force ("1": clean exit, reap even with a live heartbeat).
# Returns {reaped 0|1, {requeued ids}, {failed ids}}; failed jobs go to P:orphans.
REAP_WORKER = r"""
local P, w, force = ARGV[1], ARGV[2], ARGV[3]
if force ~= '1' and redis.call('EXISTS', P..':hb:'..w) == 1 then return {0, {}, {}} end
local lease = P..':lease:'..w
local entries = redis.call('HGETALL', lease)
local unstarted, requeued, failed = {}, {}, {}
for i = 1, #entries, 2 do
  local rid = entries[i]
  local flag, m, t, n, e = string.match(entries[i + 1], '^([01])\t([^\t]*)\t([^\t]*)\t([^\t]*)\t([^\t]*)$')
  if flag == '0' then
    unstarted[#unstarted + 1] = {rid, m, t, n, e, tonumber(e) or 0}
  else
    local job = redis.call('HGET', P..':jobs', rid)
    redis.call('HDEL', P..':jobs', rid)
    redis.call('HDEL', P..':loc', rid)
    if job then
      redis.call('RPUSH', P..':orphans', w..'\t'..job)
      failed[#failed + 1] = rid
    end
  end
end
-- Latest first, each pushed to the front: the oldest ends up at the head.
table.sort(unstarted, function(a, b) return a[6] > b[6] end)
for _, u in ipairs(unstarted) do
  local rid, m, t, n, e = u[1], u[2], u[3], u[4], u[5]
  local ring = P..':ring:'..m..':'..t
  redis.call('LPUSH', P..':q:'..m..':'..t..':'..n, rid)
  redis.call('LREM', ring, 0, n)
  redis.call('LPUSH', ring, n)
  redis.call('HINCRBY', P..':depth:'..m, t, 1)
  redis.call('HSET', P..':loc', rid, 'q\t'..m..'\t'..t..'\t'..n..'\t'..e)
  redis.call('RPUSH', P..':wake:'..m, '1')
  redis.call('LTRIM', P..':wake:'..m, -64, -1)
  requeued[#requeued + 1] = rid
end
redis.call('DEL', lease, P..':cancel:'..w, P..':hb:'..w)
redis.call('HDEL', P..':workers', w)
if force == '1' then redis.call('DEL', P..':reaped:'..w) else redis.call('SET', P..':reaped:'..w, '1', 'EX', 3600) end
return {1, requeued, failed}
"""
