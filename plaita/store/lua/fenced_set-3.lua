-- SET a key only while the writer's fencing generation still holds the execution's lease and no
-- newer generation exists: a worker that was paused past its TTL cannot overwrite its successor.
-- KEYS[1]  lease key
-- KEYS[2]  fence counter
-- KEYS[3]  the key to write
-- ARGV[1]  the writer's generation
-- ARGV[2]  value
-- Returns  1 written, 0 refused (also when the lease or fence key is not a string)
if redis.call('TYPE', KEYS[1]).ok ~= 'string' or redis.call('TYPE', KEYS[2]).ok ~= 'string' then return 0 end
local cur = redis.call('GET', KEYS[1])
local fence = tonumber(redis.call('GET', KEYS[2]) or '0')
if fence ~= tonumber(ARGV[1]) or not cur then return 0 end
local suffix = ':' .. ARGV[1]
if string.sub(cur, -string.len(suffix)) ~= suffix then return 0 end
redis.call('SET', KEYS[3], ARGV[2])
return 1
