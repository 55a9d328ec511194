-- Suspensions past their deadline, each re-armed so a timeout task that was lost is sent again
-- after a cooldown rather than never, or on every keeper pass.
-- KEYS[1]  suspension deadlines (sorted set)
-- ARGV[1]  now (epoch seconds)
-- ARGV[2]  re-arm at (epoch seconds)
-- ARGV[3]  most members returned
-- Returns  the due execution ids
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[3]))
for _, id in ipairs(due) do redis.call('ZADD', KEYS[1], ARGV[2], id) end
return due
