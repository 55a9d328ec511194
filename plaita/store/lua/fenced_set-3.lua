-- SET a key only while the writer's fencing generation still holds the execution's lease and no
-- newer generation exists: a worker that was paused past its TTL cannot overwrite its successor.
-- KEYS[1]  lease key
-- KEYS[2]  fence counter
-- KEYS[3]  the key to write
-- ARGV[1]  the writer's generation
-- ARGV[2]  value
-- Returns  1 written, 0 refused (also when the lease or fence key is not a string)
--- @include "fence"
if not holds_fence(KEYS[1], KEYS[2], ARGV[1]) then return 0 end
redis.call('SET', KEYS[3], ARGV[2])
return 1
