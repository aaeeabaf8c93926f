"""Lua scripts of the Redis admission backend. Each runs atomically inside Redis, on Redis's clock.

ARGV[1] of every script is the key prefix P (a hash tag such as "{lim}", so
every key shares one slot). The keys a plan names are built by the caller
under P (billing.counters.keys):

  bucket key        string  the GCRA theoretical arrival time, unix seconds (expires when full)
  slot key          zset    request id -> expiry of its concurrency slot
  counter key       string  the period's settled usage + open reservations (integer)
  counter key:open  hash    request id -> amount it reserved on that counter
  P:res:RID         string  the reservation of request RID (JSON: what to give back at settlement)
  P:resdl           zset    request id -> deadline (admission + hold_s), for the stale sweep
  P:respre          zset    the reservations still on their pre-enqueue lease (EXTEND renews them; CONFIRM
                            and SETTLE take them out). While leased, a reservation's slot expiries and its
                            P:resdl deadline are the lease's end: an unrenewed lease frees its slots then,
                            and the stale sweep settles the rest (to the usage record, if one was written)
  alert keys        string  set once per threshold and period (SET NX)

Numbers are Lua doubles: times in seconds keep microseconds at today's epoch,
and counters stay below 2^53 (spend is in nano-dollars: 9 million USD; billing.counters.units).
Floats go back to Python as strings (Redis truncates Lua numbers to integers).
"""

# ARGV: P, rid, hold_s, nb, ns, nc, lease_s, period_end, count_only,
#   nb x (key, kind, limit, cost, window_s), ns x (key, limit), nc x (key, kind, limit, amount, next_key)
# -> {-1} duplicate | {2, missing counter keys...} | {0, kind, key, limit, used, requested, retry_s}
#    | {1, remaining_1, reset_s_1, ...} per bucket
# lease_s > 0: slots and the reservation are held that long (P:respre) until EXTEND renews or CONFIRM ends it.
# count_only = 1: take the buckets, reserve nothing (the plan has no slots or counters).
ADMIT = r"""
local P, rid, hold = ARGV[1], ARGV[2], tonumber(ARGV[3])
local nb, ns, nc = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local lease, pe, count_only = tonumber(ARGV[7]), tonumber(ARGV[8]), ARGV[9] == '1'
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local res_key = P..':res:'..rid
if not count_only and redis.call('EXISTS', res_key) == 1 then return {-1} end
local i = 10
local buckets, slots, counters = {}, {}, {}
for _ = 1, nb do
  buckets[#buckets + 1] = {ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3]), tonumber(ARGV[i + 4])}
  i = i + 5
end
for _ = 1, ns do slots[#slots + 1] = {ARGV[i], tonumber(ARGV[i + 1])}; i = i + 2 end
for _ = 1, nc do
  counters[#counters + 1] = {ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3]), ARGV[i + 4]}
  i = i + 5
end
-- checks first (nothing taken until all pass)
local missing, values = {2}, {}
for k, c in ipairs(counters) do
  local v = redis.call('GET', c[1])
  if not v then missing[#missing + 1] = c[1] else values[k] = tonumber(v) end
end
if #missing > 1 then return missing end
for k, c in ipairs(counters) do
  if values[k] + c[4] > c[3] then return {0, c[2], c[1], c[3], values[k], c[4], '0'} end
end
for _, s in ipairs(slots) do
  redis.call('ZREMRANGEBYSCORE', s[1], '-inf', now)
  local held = redis.call('ZCARD', s[1])
  if held >= s[2] then return {0, 'concurrency', s[1], s[2], held, 1, '1'} end
end
local tats = {}
for k, b in ipairs(buckets) do
  local interval = b[5] / b[3]
  local base = math.max(tonumber(redis.call('GET', b[1]) or '0'), now)
  local tat = base + b[4] * interval
  local wait = tat - now - b[5]
  if wait > 0 then
    local used = math.ceil((base - now) / interval - 1e-3)
    if b[4] > b[3] then wait = 0 end
    return {0, b[2], b[1], b[3], used, b[4], string.format('%.6f', wait)}
  end
  tats[k] = tat
end
-- take them all
local out = {1}
local res = {b = {}, s = {}, c = {}}
for k, b in ipairs(buckets) do
  local interval = b[5] / b[3]
  local tat = tats[k]
  redis.call('SET', b[1], string.format('%.6f', tat), 'PX', math.ceil((tat - now) * 1000) + 1000)
  out[#out + 1] = math.max(0, math.floor((b[5] - (tat - now)) / interval + 1e-3))
  out[#out + 1] = string.format('%.6f', tat - now)
  res.b[#res.b + 1] = {b[1], b[2], interval, b[4]}
end
if count_only then return out end
local held_until = now + hold
if lease > 0 then held_until = now + lease end
for _, s in ipairs(slots) do
  redis.call('ZADD', s[1], held_until, rid)
  redis.call('EXPIRE', s[1], math.ceil(hold) + 60)
  res.s[#res.s + 1] = s[1]
end
for _, c in ipairs(counters) do
  redis.call('INCRBY', c[1], c[4])
  redis.call('HSET', c[1]..':open', rid, c[4])
  local ttl = redis.call('TTL', c[1])
  if ttl > 0 then redis.call('EXPIRE', c[1]..':open', ttl) end
  res.c[#res.c + 1] = {c[1], c[2], c[4], c[3], c[5]}
end
res.h, res.pe = hold, pe
redis.call('SET', res_key, cjson.encode(res), 'EX', math.ceil(hold) * 4 + 86400)
redis.call('ZADD', P..':resdl', held_until, rid)
if lease > 0 then redis.call('ZADD', P..':respre', held_until, rid) end
return out
"""

# ARGV: P, seconds, rid... -> how many leases were renewed (a reservation gone, confirmed, or past its lease's
# end, whose slots may have gone to other requests since, is not)
EXTEND = r"""
local P, secs = ARGV[1], tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local renewed = 0
for i = 3, #ARGV do
  local rid = ARGV[i]
  local lease_end = redis.call('ZSCORE', P..':respre', rid)
  local raw = redis.call('GET', P..':res:'..rid)
  if lease_end and tonumber(lease_end) > now and raw then
    redis.call('ZADD', P..':respre', now + secs, rid)
    redis.call('ZADD', P..':resdl', now + secs, rid)
    for _, key in ipairs(cjson.decode(raw).s) do redis.call('ZADD', key, 'XX', now + secs, rid) end
    renewed = renewed + 1
  end
end
return renewed
"""

# ARGV: P, rid -> 1 held up to its hold_s from now (the job is queued) | 0 the reservation is gone (the stale
# sweep released it after its lease ran out, or it was settled)
CONFIRM = r"""
local P, rid = ARGV[1], ARGV[2]
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local raw = redis.call('GET', P..':res:'..rid)
if not raw then return 0 end
local res = cjson.decode(raw)
redis.call('ZREM', P..':respre', rid)
local hold = tonumber(res.h or 0)
if hold > 0 then
  redis.call('ZADD', P..':resdl', now + hold, rid)
  for _, key in ipairs(res.s) do
    redis.call('ZADD', key, now + hold, rid)
    redis.call('EXPIRE', key, math.ceil(hold) + 60)
  end
end
return 1
"""

# ARGV: P, JSON [[rid, tokens, quota, spend, at], ...] (a worker's step in one call, its arguments in one string)
# -> {settled, then per counter the requests had reserved on: key, kind, value after, limit}
# Each bucket, slot and counter is written once for all the requests that reserved on it: the
# refunds of a bucket add up (max(now, tat - a - b) = max(now, max(now, tat - a) - b) for a, b >= 0),
# the corrections of a counter too. A request whose record is dated (`at`) at or after its reservation's
# period end (`pe`) gives its admission period's counters back whole and is counted in the next period's
# (each counter's next key), when that counter exists (when it does not, its rebuild reads the record).
SETTLE = r"""
local P = ARGV[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local settled, rids = 0, {}
local back, buckets = {}, {}  -- bucket key -> seconds its TAT moves back
local holders, slots = {}, {}  -- slot key -> request ids freed
local delta, info, openers, counters = {}, {}, {}, {}  -- counter key -> correction, {kind, limit}, request ids
local function counter_of(key, kind, limit)
  if not delta[key] then delta[key] = 0; info[key] = {kind, limit}; openers[key] = {}; counters[#counters + 1] = key end
end
for _, item in ipairs(cjson.decode(ARGV[2])) do
  local rid = item[1]
  local actual = {tokens = item[2], quota = item[3], spend = item[4]}
  local at = tonumber(item[5] or 0)
  rids[#rids + 1] = rid
  local res_key = P..':res:'..rid
  local raw = redis.call('GET', res_key)
  if raw then
    redis.call('DEL', res_key)
    settled = settled + 1
    local res = cjson.decode(raw)
    for _, b in ipairs(res.b) do
      local refund = b[4] - actual.tokens
      if b[2] == 'tokens' and refund > 0 then
        if not back[b[1]] then back[b[1]] = 0; buckets[#buckets + 1] = b[1] end
        back[b[1]] = back[b[1]] + refund * b[3]
      end
    end
    for _, key in ipairs(res.s) do
      if not holders[key] then holders[key] = {}; slots[#slots + 1] = key end
      holders[key][#holders[key] + 1] = rid
    end
    local crossed = res.pe and res.pe > 0 and at > 0 and at >= res.pe
    for _, c in ipairs(res.c) do
      counter_of(c[1], c[2], c[4])
      openers[c[1]][#openers[c[1]] + 1] = rid
      if crossed then
        delta[c[1]] = delta[c[1]] - c[3]
        if c[5] and c[5] ~= '' then
          counter_of(c[5], c[2], c[4])
          delta[c[5]] = delta[c[5]] + (actual[c[2]] or 0)
        end
      else
        delta[c[1]] = delta[c[1]] + (actual[c[2]] or 0) - c[3]
      end
    end
  end
end
redis.call('ZREM', P..':resdl', unpack(rids))
redis.call('ZREM', P..':respre', unpack(rids))
for _, key in ipairs(buckets) do
  local tat = redis.call('GET', key)
  if tat then
    local ttl = redis.call('PTTL', key)
    redis.call('SET', key, string.format('%.6f', math.max(now, tonumber(tat) - back[key])), 'PX', math.max(1, ttl))
  end
end
for _, key in ipairs(slots) do redis.call('ZREM', key, unpack(holders[key])) end
local out = {settled}
for _, key in ipairs(counters) do
  if #openers[key] > 0 then redis.call('HDEL', key..':open', unpack(openers[key])) end
  if redis.call('EXISTS', key) == 1 then
    out[#out + 1] = key; out[#out + 1] = info[key][1]
    out[#out + 1] = redis.call('INCRBY', key, delta[key]); out[#out + 1] = info[key][2]
  end
end
return out
"""

# ARGV: P -> request ids whose reservation passed its deadline
STALE = r"""
local t = redis.call('TIME')
return redis.call('ZRANGEBYSCORE', ARGV[1]..':resdl', '-inf', tonumber(t[1]) + tonumber(t[2]) / 1000000)
"""

# ARGV: P, key, value, ttl_s -> 1 seeded | 0 it existed
SEED = r"""
if redis.call('SET', ARGV[2], ARGV[3], 'NX', 'EX', ARGV[4]) then
  redis.call('EXPIRE', ARGV[2]..':open', ARGV[4])
  return 1
end
return 0
"""
