-- Publish one named value of a running execution (``ctx.publish``), fenced like every write of
-- its state: refused once the writer's lease generation no longer holds the execution. The hash
-- expires with the execution: it takes the state's TTL (none while the execution has none).
-- KEYS[1]  lease key
-- KEYS[2]  fence counter
-- KEYS[3]  the execution's events hash (field = name, value = JSON record)
-- KEYS[4]  execution state (only its TTL is read)
-- ARGV[1]  the writer's generation
-- ARGV[2]  name
-- ARGV[3]  record JSON
-- ARGV[4]  most names one execution may have
-- Returns  1 written; 0 refused (fenced out); -1 refused: ARGV[4] other names exist already;
--          -2 refused: the events key is not a hash. Nothing is written unless 1.
--- @include "fence"
if not holds_fence(KEYS[1], KEYS[2], ARGV[1]) then return 0 end
local kind = redis.call('TYPE', KEYS[3]).ok
if kind ~= 'hash' and kind ~= 'none' then return -2 end
if redis.call('HEXISTS', KEYS[3], ARGV[2]) == 0 and redis.call('HLEN', KEYS[3]) >= tonumber(ARGV[4]) then
  return -1
end
redis.call('HSET', KEYS[3], ARGV[2], ARGV[3])
local ttl = redis.call('PTTL', KEYS[4])
if ttl > 0 then redis.call('PEXPIRE', KEYS[3], ttl) else redis.call('PERSIST', KEYS[3]) end
return 1
