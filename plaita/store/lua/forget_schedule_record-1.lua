-- Forget a recorded schedule that nobody refreshed: delete its field only if it still holds
-- what the keeper read (a loader that recorded it again meanwhile wins).
-- KEYS[1]  the queue's schedule records (hash)
-- ARGV[1]  flow id (field)
-- ARGV[2]  the record as read
-- Returns  1 forgotten, 0 changed since (or gone)
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then return redis.call('HDEL', KEYS[1], ARGV[1]) end
return 0
