-- Give back a flow slot (compare-and-delete: only the task that took it gives it back), and give
-- the free slots to the oldest parked starts.
-- KEYS[1]  the flow's slot set (zset)
-- KEYS[2]  the flow's slot owners (hash)
-- KEYS[3]  the flow's parked starts (zset)
-- KEYS[4]  the flow's parked start tasks (hash)
-- KEYS[5]  the flow's parked start deadlines (zset)
-- KEYS[6]  the flow's run-time limits (hash): its max_concurrent replaces ARGV's when set
-- ARGV[1]  execution (member)
-- ARGV[2]  the token it was taken with ('~promoted': a slot reserved for a parked start)
-- ARGV[3]  max_concurrent (0 = promote no parked start)
-- ARGV[4]  slot ttl (ms), for a reservation
-- ARGV[5]  '1': the start is no longer waiting (cancelled, past its deadline): drop it from the
--          parked starts too
-- ARGV[6]  the concurrency key ('' = the flow's own slots): which limit KEYS[6] overrides
-- Returns  {1 released or 0 not ours (expired, or taken over by the execution's next task),
--          body...}: the bodies are parked starts given a slot, for the caller to put back on
--          their streams.
--- @include "flow_slots"
local kinds = {'zset', 'hash', 'zset', 'hash', 'zset', 'hash'}
if wrong_type(KEYS, kinds) then return {0} end
local out = {0}
if redis.call('HGET', KEYS[2], ARGV[1]) == ARGV[2] then
  redis.call('HDEL', KEYS[2], ARGV[1])
  redis.call('ZREM', KEYS[1], ARGV[1])
  out[1] = 1
end
if ARGV[5] == '1' then
  redis.call('ZREM', KEYS[3], ARGV[1])
  redis.call('HDEL', KEYS[4], ARGV[1])
  redis.call('ZREM', KEYS[5], ARGV[1])
end
local limit, ttl_ms = override_limit(KEYS[6], tonumber(ARGV[3]), ARGV[6]), tonumber(ARGV[4])
if limit > 0 then
  local now_ms = server_ms()
  prune_slots(KEYS[1], KEYS[2], now_ms)
  local bodies = promote_parked(KEYS[1], KEYS[2], KEYS[3], KEYS[4], limit, ttl_ms, now_ms, '')
  if #bodies > 0 then keep_slot_keys(KEYS[1], KEYS[2], ttl_ms) end
  for _, body in ipairs(bodies) do out[#out + 1] = body end
end
return out
