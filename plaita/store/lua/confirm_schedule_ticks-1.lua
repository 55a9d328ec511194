-- The claimed ticks' starts are enqueued: drop `pending` if it is still the one confirmed
-- (a keeper that re-enqueued a stale claim must not drop a newer one) and record the newest.
-- KEYS[1]  schedule hash (plaita:schedule:<flow>)
-- ARGV[1]  the pending JSON confirmed
-- ARGV[2]  its pending_at_s
-- ARGV[3]  execution id of the newest tick started ("" = none)
-- ARGV[4]  that tick (epoch seconds)
-- Returns  1 confirmed, 0 pending had changed
if redis.call('HGET', KEYS[1], 'pending') ~= ARGV[1] or redis.call('HGET', KEYS[1], 'pending_at_s') ~= ARGV[2] then
  return 0
end
redis.call('HDEL', KEYS[1], 'pending', 'pending_at_s')
if ARGV[3] ~= '' then redis.call('HSET', KEYS[1], 'last_execution_id', ARGV[3], 'last_started_tick_s', ARGV[4]) end
return 1
