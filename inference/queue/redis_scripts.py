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
  P:wakew:W            list  wake-up tokens for worker W alone (a job another worker skipped for it)
  P:pk                 hash  request id -> its routing keys, comma-joined (queue.routing; queued or leased)
  P:aff:M              hash  routing key -> the worker that holds it, for model M
  P:owns:W             zset  the routing keys worker W holds, scored by last use (capped)
  P:room:W             string "ROOM,AT,EVERY" of worker W's last intake: the jobs it could take, when (Redis
                       TIME, s) and the seconds between its intakes while busy (0: idle or unknown);
                       expires after ROOM_TTL_S
  P:demand:M           zset  requests waiting for a worker of model M (none serves it), scored by when they give up

Model names may contain ':' but tiers and tenants (slug, integer id) may not,
so the keys stay unambiguous; no name may contain a tab (Job checks).
"""

from .routing import LATE_FACTOR, LATE_SLACK_S, ROOM_TTL_S

ENQUEUE = r"""
local P, rid, job, m, t, n, e, maxd = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], tonumber(ARGV[8])
if redis.call('HEXISTS', P..':loc', rid) == 1 then return -1 end
local depth = tonumber(redis.call('HGET', P..':depth:'..m, t) or '0')
if maxd > 0 and depth >= maxd then return 0 end
redis.call('HSET', P..':jobs', rid, job)
if ARGV[9] and ARGV[9] ~= '' then redis.call('HSET', P..':pk', rid, ARGV[9]) end
redis.call('HSET', P..':loc', rid, 'q\t'..m..'\t'..t..'\t'..n..'\t'..e)
local q = P..':q:'..m..':'..t..':'..n
if redis.call('RPUSH', q, rid) == 1 then redis.call('RPUSH', P..':ring:'..m..':'..t, n) end
redis.call('HINCRBY', P..':depth:'..m, t, 1)
redis.call('RPUSH', P..':wake:'..m, '1')
redis.call('LTRIM', P..':wake:'..m, -64, -1)
return 1
"""

# The room a worker reports at an intake (P:room:W; read by LEASE's `acceptable`). `every` is the worker's
# seconds between intakes while busy; a worker holding nothing is woken when wanted, so it gives none.
_ROOM = (f"local LATE_FACTOR, LATE_SLACK_S, ROOM_TTL_MS = {LATE_FACTOR}, {LATE_SLACK_S}, {int(ROOM_TTL_S * 1000)}\n"
         + r"""
local function clock() local t = redis.call('TIME'); return tonumber(t[1]) + tonumber(t[2]) / 1000000 end
local function room_report(P, w, room, every)
  if redis.call('HLEN', P..':lease:'..w) == 0 then every = 0 end
  redis.call('SET', P..':room:'..w, string.format('%d,%.6f,%.6f', room, clock(), every), 'PX', ROOM_TTL_MS)
end
""")

# ARGV: P, model, worker, now (unix s), steal_after_s (<= 0: routing off), scan, keys_per_worker, room,
# balance, seconds between this worker's intakes while busy (0: unknown), tier, tier, ... (the selector's plan).
# Returns {jobs JSON, ms until a job skipped for another worker may be stolen (-1: none skipped)}.
# Routing: queue/routing.py; with it off, each tier's ring head is taken.
LEASE = _ROOM + r"""
local P, m, w = ARGV[1], ARGV[2], ARGV[3]
local now, steal, scan, cap, room = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local balance, every = tonumber(ARGV[9]), tonumber(ARGV[10])
if redis.call('EXISTS', P..':reaped:'..w) == 1 then return {{}, -1} end
local mine = redis.call('HLEN', P..':lease:'..w)  -- the jobs w holds (as leased before this call)
local rnow = steal > 0 and clock() or 0  -- Redis's clock: the owners' reported intakes are on it
local aff, owns = P..':aff:'..m, P..':owns:'..w
local out, wait, woken = {}, -1, {}
local function live(o) return o == w or redis.call('EXISTS', P..':hb:'..o) == 1 end
local function keys_of(rid)
  local keys, pk = {}, redis.call('HGET', P..':pk', rid)
  if pk then for k in string.gmatch(pk, '[^,]+') do keys[#keys + 1] = k end end
  return keys
end
-- may w take rid now? (and the keys to claim when it does)
local function acceptable(rid)
  if steal <= 0 then return true, {} end
  local keys = keys_of(rid)
  local o = nil
  for i = #keys, 1, -1 do
    local holder = redis.call('HGET', aff, keys[i])
    if holder and live(holder) then o = holder; break end
  end
  if (not o) or o == w then return true, keys end
  local oroom, oat, oevery = string.match(redis.call('GET', P..':room:'..o) or '0', '^(%d+),?([^,]*),?([^,]*)$')
  if (tonumber(oroom) or 0) <= 0 then return true, keys end
  if redis.call('HLEN', P..':lease:'..o) - mine >= balance then return true, keys end
  local e = tonumber(string.match(redis.call('HGET', P..':loc', rid), '\t([^\t]*)$')) or 0
  local left = e + steal - now
  if left <= 0 then return true, keys end
  oat, oevery = tonumber(oat) or 0, tonumber(oevery) or 0
  if oevery > 0 then  -- the owner is busy: it comes back at its next intake, expected one intake interval on
    local late = oat + LATE_FACTOR * oevery + LATE_SLACK_S - rnow
    if oat + oevery - rnow >= left or late <= 0 then return true, keys end  -- not back before the bound, or late
    if late < left then left = late end
  end
  if wait < 0 or left < wait then wait = left end
  if not woken[o] then
    woken[o] = true
    redis.call('RPUSH', P..':wakew:'..o, '1')
    redis.call('LTRIM', P..':wakew:'..o, -4, -1)
  end
  return false, keys
end
local exhausted = {}  -- tiers whose scan found nothing this worker may take (the same again within this call)
for i = 11, #ARGV do
  local t = ARGV[i]
  local ring = P..':ring:'..m..':'..t
  local tenants = exhausted[t] and {} or redis.call('LRANGE', ring, 0, (steal > 0 and scan or 1) - 1)
  local took = false
  for _, n in ipairs(tenants) do
    local q = P..':q:'..m..':'..t..':'..n
    local rid = redis.call('LINDEX', q, 0)
    local ok, keys = false, {}
    if rid then ok, keys = acceptable(rid) end
    if ok then
      redis.call('LPOP', q)
      redis.call('LREM', ring, 1, n)
      if redis.call('LLEN', q) > 0 then redis.call('RPUSH', ring, n) end
      local loc = redis.call('HGET', P..':loc', rid)
      if redis.call('HINCRBY', P..':depth:'..m, t, -1) <= 0 then redis.call('HDEL', P..':depth:'..m, t) end
      redis.call('HSET', P..':loc', rid, 'l\t'..w)
      redis.call('HSET', P..':lease:'..w, rid, '0'..string.sub(loc, 2))
      out[#out + 1] = redis.call('HGET', P..':jobs', rid)
      for _, k in ipairs(keys) do
        local holder = redis.call('HGET', aff, k)
        if (not holder) or not live(holder) then redis.call('HSET', aff, k, w) end
        if (not holder) or holder == w or not live(holder) then redis.call('ZADD', owns, now, k) end
      end
      took = true
      break
    end
  end
  if not took then exhausted[t] = true end
end
if steal > 0 then
  local over = redis.call('ZCARD', owns) - cap
  if over > 0 then
    for _, k in ipairs(redis.call('ZRANGE', owns, 0, over - 1)) do
      if redis.call('HGET', aff, k) == w then redis.call('HDEL', aff, k) end
    end
    redis.call('ZREMRANGEBYRANK', owns, 0, over - 1)
  end
  room_report(P, w, math.max(0, room - #out), every)
end
if #out > 0 then redis.call('HSET', P..':workers', w, m) end
return {out, wait < 0 and -1 or math.ceil(wait * 1000)}
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
  redis.call('HDEL', P..':pk', rid)
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
    redis.call('HDEL', P..':pk', rid)
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
# ...and with them the model's depth hash, flat: {ids, {tier, count, ...}} (a worker's ask before each step);
# ARGV[4] and ARGV[5], when given, are the worker's room and seconds between intakes, kept for queue.routing.
TAKE_CANCELS_AND_DEPTHS = _ROOM + _TAKE_CANCELS + (
    "if ARGV[4] then room_report(ARGV[1], ARGV[2], tonumber(ARGV[4]), tonumber(ARGV[5] or '0')) end\n"
    "return {ids, redis.call('HGETALL', ARGV[1]..':depth:'..ARGV[3])}\n")

# ARGV: P, model; flat {tier, enqueued_at of its oldest queued job, ...} (each tenant's head is its oldest).
OLDEST = r"""
local P, m = ARGV[1], ARGV[2]
local flat = redis.call('HGETALL', P..':depth:'..m)
local out = {}
for i = 1, #flat, 2 do
  local t, oldest = flat[i], nil
  for _, n in ipairs(redis.call('LRANGE', P..':ring:'..m..':'..t, 0, -1)) do
    local rid = redis.call('LINDEX', P..':q:'..m..':'..t..':'..n, 0)
    local loc = rid and redis.call('HGET', P..':loc', rid)
    local e = loc and tonumber(string.match(loc, '\t([^\t]*)$'))
    if e and (not oldest or e < oldest) then oldest = e end
  end
  if oldest then out[#out + 1] = t; out[#out + 1] = string.format('%.6f', oldest) end
end
return out
"""

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
    redis.call('HDEL', P..':pk', rid)
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
-- its routing keys attract no more work (queue.routing)
local wm = redis.call('HGET', P..':workers', w)
if wm then
  for _, k in ipairs(redis.call('ZRANGE', P..':owns:'..w, 0, -1)) do
    if redis.call('HGET', P..':aff:'..wm, k) == w then redis.call('HDEL', P..':aff:'..wm, k) end
  end
end
redis.call('DEL', lease, P..':cancel:'..w, P..':hb:'..w, P..':owns:'..w, P..':room:'..w, P..':wakew:'..w)
redis.call('HDEL', P..':workers', w)
if force == '1' then redis.call('DEL', P..':reaped:'..w) else redis.call('SET', P..':reaped:'..w, '1', 'EX', 3600) end
return {1, requeued, failed}
"""
