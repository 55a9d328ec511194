-- Take one of a flow's fleet-wide slots (max_concurrent) and, for a start, pass its start rates
-- (max_starts_per_s, a token bucket; rate_limit, a sliding window), atomically. A start that
-- finds no slot is parked in order of its start (when ARGV[9] is set); every key has the flow's
-- own hash tag.
-- With a concurrency key (ARGV[12]: max_concurrent_per_key), KEYS[1], KEYS[2] and KEYS[5] are
-- that key's own slot set, owners and parked starts (the flow's hash tag still), so a busy key
-- parks only its own starts.
-- KEYS[1]  the flow's slot set: zset, member = execution, score = expiry (server ms)
-- KEYS[2]  the flow's slot owners: hash, execution -> token of the task holding its slot
-- KEYS[3]  the flow's start bucket: hash {tokens, at_ms}
-- KEYS[4]  the flow's start window: zset, member = acquire token, score = start time (server ms)
-- KEYS[5]  the flow's parked starts: zset, member = execution, score = start order
-- KEYS[6]  the flow's parked start tasks: hash, execution -> task body (JSON)
-- KEYS[7]  the flow's parked start deadlines: zset, member = execution, score = deadline (ms)
-- KEYS[8]  the flow's run-time limits (``plaita limits set``): hash; a field there replaces the
--          matching ARGV of a limit the flow declares (max_concurrent, max_starts_per_s)
-- KEYS[9]  the flow's concurrency keys with parked starts: set (the sweep visits them)
-- ARGV[1]  execution (member)
-- ARGV[2]  token (unique per acquire)
-- ARGV[3]  max_concurrent (0 = no slot is taken)
-- ARGV[4]  slot ttl (ms)
-- ARGV[5]  starts per second (0 = no bucket, or not a start)
-- ARGV[6]  bucket size (burst)
-- ARGV[7]  rate_limit N (0 = no window, or not a start)
-- ARGV[8]  rate_limit period (ms)
-- ARGV[9]  park order ('' = do not park: a resume), the start's stream id as a number
-- ARGV[10] task body to park (JSON)
-- ARGV[11] the start's deadline (epoch ms; '' = none), for the sweep to end it in time
-- ARGV[12] the concurrency key's name in KEYS[9] ('' = the flow's own slots)
-- Returns  {code, wait_ms, body...}: code 1 taken, 0 every slot is held, 2 a start rate is
--          spent (no slot taken; wait_ms until the next start may pass), 3 parked; the bodies
--          are parked starts this call gave a slot to, for the caller to put back on their
--          streams. An execution's own slot (stale: its worker died, the lease the caller holds
--          proves it; or reserved for it as a parked start) is taken over. Expired slots are
--          pruned first.
--- @include "flow_slots"
local kinds = {'zset', 'hash', 'hash', 'zset', 'zset', 'hash', 'zset', 'hash', 'set'}
local bad = wrong_type(KEYS, kinds)
if bad then return redis.error_reply('WRONGTYPE ' .. KEYS[bad] .. ' is not a ' .. kinds[bad]) end
local now_ms = server_ms()
local limit, ttl_ms = tonumber(ARGV[3]), tonumber(ARGV[4])
local rate, burst = tonumber(ARGV[5]), tonumber(ARGV[6])
local window_n, window_ms = tonumber(ARGV[7]), tonumber(ARGV[8])
limit = override_limit(KEYS[8], limit, ARGV[12])
if rate > 0 then
  local set_rate = tonumber(redis.call('HGET', KEYS[8], 'max_starts_per_s'))
  if set_rate and set_rate > 0 then rate, burst = set_rate, math.max(1, set_rate) end
end
local parking = ARGV[9] ~= ''
local promoted = {}

local function reply(code, wait_ms)
  local out = {code, wait_ms}
  for _, body in ipairs(promoted) do out[#out + 1] = body end
  return out
end

if limit > 0 then
  prune_slots(KEYS[1], KEYS[2], now_ms)
  if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then
    local free
    if parking then
      promoted, free = promote_parked(KEYS[1], KEYS[2], KEYS[5], KEYS[6], limit, ttl_ms, now_ms, ARGV[1])
    else
      free = redis.call('ZCARD', KEYS[1]) < limit
    end
    if not free then
      if not parking then return reply(0, 0) end
      redis.call('ZADD', KEYS[5], 'NX', tonumber(ARGV[9]), ARGV[1])
      redis.call('HSETNX', KEYS[6], ARGV[1], ARGV[10])
      if ARGV[11] ~= '' then redis.call('ZADD', KEYS[7], 'NX', tonumber(ARGV[11]), ARGV[1]) end
      if ARGV[12] ~= '' then redis.call('SADD', KEYS[9], ARGV[12]) end
      return reply(3, 0)
    end
  end
end

local tokens
if rate > 0 then
  local bucket = redis.call('HMGET', KEYS[3], 'tokens', 'at_ms')
  local at_ms
  tokens, at_ms = tonumber(bucket[1]), tonumber(bucket[2])
  if tokens == nil or at_ms == nil then
    tokens, at_ms = burst, now_ms
  end
  tokens = math.min(burst, tokens + math.max(0, now_ms - at_ms) * rate / 1000)
  if tokens < 1 then
    return reply(2, math.ceil((1 - tokens) * 1000 / rate))
  end
end
if window_n > 0 then
  -- A start at t counts in every window [t, t + period]: one older than now - period is out.
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', '(' .. (now_ms - window_ms))
  if redis.call('ZCARD', KEYS[4]) >= window_n then
    local oldest = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')
    return reply(2, math.max(1, tonumber(oldest[2]) + window_ms + 1 - now_ms))
  end
end

if rate > 0 then
  redis.call('HSET', KEYS[3], 'tokens', tostring(tokens - 1), 'at_ms', now_ms)
  redis.call('PEXPIRE', KEYS[3], math.ceil(burst * 1000 / rate) + 60000)
end
if window_n > 0 then
  redis.call('ZADD', KEYS[4], now_ms, ARGV[2])
  redis.call('PEXPIRE', KEYS[4], window_ms + 60000)
end
if limit > 0 then
  redis.call('ZADD', KEYS[1], now_ms + ttl_ms, ARGV[1])
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
  redis.call('ZREM', KEYS[5], ARGV[1])
  redis.call('HDEL', KEYS[6], ARGV[1])
  redis.call('ZREM', KEYS[7], ARGV[1])
  keep_slot_keys(KEYS[1], KEYS[2], ttl_ms)
end
return reply(1, 0)
