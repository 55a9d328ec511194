-- The periodic sweep of one flow's parked starts (every worker that runs the flow, every ttl/3):
-- give its free slots to the oldest of them. A slot frees without a release when its holder dies
-- (it expires), and a reservation expires when the worker that promoted a start died before
-- putting it back on its stream; with no other acquire or release of the flow, only this sweep
-- moves its parked starts on. It also puts back on their streams, without a slot, the parked
-- starts whose deadline passed: read, such a start takes no slot and ends cancelled (should that
-- re-add be lost, the start is still parked and ends so when its turn comes).
-- KEYS[1]  the flow's slot set (zset)
-- KEYS[2]  the flow's slot owners (hash)
-- KEYS[3]  the flow's parked starts (zset)
-- KEYS[4]  the flow's parked start tasks (hash)
-- KEYS[5]  the flow's parked start deadlines (zset, score = deadline in epoch ms)
-- KEYS[6]  the flow's run-time limits (hash): its max_concurrent replaces ARGV's when set
-- KEYS[7]  the flow's concurrency keys with parked starts (set): a key's entry leaves it once
--          none of its starts is parked
-- ARGV[1]  max_concurrent
-- ARGV[2]  slot ttl (ms), for a reservation
-- ARGV[3]  most starts past their deadline put back in one call (0 for a concurrency key: the
--          flow's own sweep does it)
-- ARGV[4]  the concurrency key ('' = the flow's own slots; KEYS[1..3] are then that key's)
-- Returns  {waiting, body...}: how many starts are parked (promoted ones not yet running
--          included; the concurrency key's, or the whole flow's), and the bodies given a slot
--          or past their deadline, for the caller to put back on their streams
--- @include "flow_slots"
local kinds = {'zset', 'hash', 'zset', 'hash', 'zset', 'hash', 'set'}
local bad = wrong_type(KEYS, kinds)
if bad then return redis.error_reply('WRONGTYPE ' .. KEYS[bad] .. ' is not a ' .. kinds[bad]) end
local limit, ttl_ms = override_limit(KEYS[6], tonumber(ARGV[1]), ARGV[4]), tonumber(ARGV[2])
local now_ms = server_ms()
prune_slots(KEYS[1], KEYS[2], now_ms)
local bodies = promote_parked(KEYS[1], KEYS[2], KEYS[3], KEYS[4], limit, ttl_ms, now_ms, '')
if #bodies > 0 then keep_slot_keys(KEYS[1], KEYS[2], ttl_ms) end
local waiting = redis.call('ZCARD', KEYS[3])
if ARGV[4] ~= '' then
  if waiting == 0 then redis.call('SREM', KEYS[7], ARGV[4]) end
else
  waiting = redis.call('HLEN', KEYS[4])  -- every parked start of the flow, of every concurrency key
end
local out = {waiting}
for _, body in ipairs(bodies) do out[#out + 1] = body end
for _, member in ipairs(redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now_ms, 'LIMIT', 0, tonumber(ARGV[3]))) do
  redis.call('ZREM', KEYS[5], member)
  local body = redis.call('HGET', KEYS[4], member)
  if body and not redis.call('ZSCORE', KEYS[1], member) then out[#out + 1] = body end
end
return out
