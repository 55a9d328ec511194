-- Extend the flow slots a worker holds (compare-and-extend, like a lease renewal).
-- KEYS[1]  the flow's slot set (zset)
-- KEYS[2]  the flow's slot owners (hash)
-- ARGV[1]  slot ttl (ms)
-- ARGV[2..]  pairs: execution id, the token it was taken with
-- Returns  per pair 1 extended, 0 lost (expired and pruned, or taken over)
if redis.call('TYPE', KEYS[1]).ok ~= 'zset' or redis.call('TYPE', KEYS[2]).ok ~= 'hash' then
  local lost = {}
  for i = 2, #ARGV, 2 do
    lost[#lost + 1] = 0
  end
  return lost
end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl_ms = tonumber(ARGV[1])
local out = {}
for i = 2, #ARGV, 2 do
  local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if score and tonumber(score) > now_ms and redis.call('HGET', KEYS[2], ARGV[i]) == ARGV[i + 1] then
    redis.call('ZADD', KEYS[1], 'XX', now_ms + ttl_ms, ARGV[i])
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
for i = 1, 2 do
  if redis.call('PTTL', KEYS[i]) < ttl_ms + 60000 then
    redis.call('PEXPIRE', KEYS[i], ttl_ms + 60000)
  end
end
return out
