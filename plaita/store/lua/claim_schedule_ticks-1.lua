-- Claim a schedule's due ticks: compare-and-set of the newest tick started, so of any number
-- of keepers passing at once exactly one claims each tick. The claimed ticks stay in
-- `pending` until their starts are enqueued (confirm_schedule_ticks): a keeper that dies in
-- between leaves them there, and a later pass enqueues them again (same execution ids).
-- KEYS[1]  schedule hash (plaita:schedule:<flow>)
-- ARGV[1]  newest tick this keeper read ("" = none yet)
-- ARGV[2]  newest tick now claimed
-- ARGV[3]  claimed ticks to start, JSON {"ticks": [...], "missed": n} ("" = none: only the newest moves)
-- ARGV[4]  now (epoch seconds)
-- Returns  1 claimed, 0 another keeper moved it first (or has ticks pending)
local last = redis.call('HGET', KEYS[1], 'last_tick_s')
if (last or '') ~= ARGV[1] or redis.call('HEXISTS', KEYS[1], 'pending') == 1 then return 0 end
redis.call('HSET', KEYS[1], 'last_tick_s', ARGV[2], 'checked_at_s', ARGV[4])
if ARGV[3] ~= '' then redis.call('HSET', KEYS[1], 'pending', ARGV[3], 'pending_at_s', ARGV[4]) end
return 1
