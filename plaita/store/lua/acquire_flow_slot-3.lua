-- Take one of a flow's fleet-wide slots (max_concurrent) and, for a start, one token of its
-- start rate (max_starts_per_s), atomically. Every key has the flow's own hash tag.
-- KEYS[1]  the flow's slot set: zset, member = execution id, score = expiry (server ms)
-- KEYS[2]  the flow's slot owners: hash, execution id -> token of the task holding its slot
-- KEYS[3]  the flow's start bucket: hash {tokens, at_ms}
-- ARGV[1]  execution id
-- ARGV[2]  token (unique per acquire)
-- ARGV[3]  max_concurrent (0 = no slot is taken)
-- ARGV[4]  slot ttl (ms)
-- ARGV[5]  starts per second (0 = no rate limit, or not a start)
-- ARGV[6]  bucket size (burst)
-- Returns  {1, 0} taken; {0, 0} every slot is held; {2, wait_ms} the start rate is spent (no
--          slot taken). An execution's own stale slot (its worker died; the lease the caller
--          holds proves it) is taken over. Expired slots are pruned first.
for i = 1, 3 do
  local kind = redis.call('TYPE', KEYS[i]).ok
  local want = (i == 1) and 'zset' or 'hash'
  if kind ~= want and kind ~= 'none' then
    return redis.error_reply('WRONGTYPE ' .. KEYS[i] .. ' is not a ' .. want)
  end
end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local limit, ttl_ms = tonumber(ARGV[3]), tonumber(ARGV[4])
local rate, burst = tonumber(ARGV[5]), tonumber(ARGV[6])

if limit > 0 then
  local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now_ms)
  for _, member in ipairs(expired) do
    redis.call('ZREM', KEYS[1], member)
    redis.call('HDEL', KEYS[2], member)
  end
  if not redis.call('ZSCORE', KEYS[1], ARGV[1]) and redis.call('ZCARD', KEYS[1]) >= limit then
    return {0, 0}
  end
end

if rate > 0 then
  local bucket = redis.call('HMGET', KEYS[3], 'tokens', 'at_ms')
  local tokens, at_ms = tonumber(bucket[1]), tonumber(bucket[2])
  if tokens == nil or at_ms == nil then
    tokens, at_ms = burst, now_ms
  end
  tokens = math.min(burst, tokens + math.max(0, now_ms - at_ms) * rate / 1000)
  if tokens < 1 then
    return {2, math.ceil((1 - tokens) * 1000 / rate)}
  end
  redis.call('HSET', KEYS[3], 'tokens', tostring(tokens - 1), 'at_ms', now_ms)
  redis.call('PEXPIRE', KEYS[3], math.ceil(burst * 1000 / rate) + 60000)
end

if limit > 0 then
  redis.call('ZADD', KEYS[1], now_ms + ttl_ms, ARGV[1])
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
  -- The keys outlive every member (each expires within ttl of its last renewal), and an
  -- abandoned flow's keys go away on their own.
  for i = 1, 2 do
    if redis.call('PTTL', KEYS[i]) < ttl_ms + 60000 then
      redis.call('PEXPIRE', KEYS[i], ttl_ms + 60000)
    end
  end
end
return {1, 0}
