-- The periodic sweep of one flow's parked starts (every worker that runs the flow, every ttl/3):
-- give its free slots to the oldest of them. A slot frees without a release when its holder dies
-- (it expires), and a reservation expires when the worker that promoted a start died before
-- putting it back on its stream; with no other acquire or release of the flow, only this sweep
-- moves its parked starts on.
-- KEYS[1]  the flow's slot set (zset)
-- KEYS[2]  the flow's slot owners (hash)
-- KEYS[3]  the flow's parked starts (zset)
-- KEYS[4]  the flow's parked start tasks (hash)
-- ARGV[1]  max_concurrent
-- ARGV[2]  slot ttl (ms), for a reservation
-- Returns  {waiting, body...}: how many starts are parked (promoted ones not yet running
--          included), and the bodies given a slot, for the caller to put back on their streams
--- @include "flow_slots"
local kinds = {'zset', 'hash', 'zset', 'hash'}
for i = 1, 4 do
  local kind = redis.call('TYPE', KEYS[i]).ok
  if kind ~= kinds[i] and kind ~= 'none' then
    return redis.error_reply('WRONGTYPE ' .. KEYS[i] .. ' is not a ' .. kinds[i])
  end
end
local limit, ttl_ms = tonumber(ARGV[1]), tonumber(ARGV[2])
local now_ms = server_ms()
prune_slots(KEYS[1], KEYS[2], now_ms)
local bodies = promote_parked(KEYS[1], KEYS[2], KEYS[3], KEYS[4], limit, ttl_ms, now_ms, '')
if #bodies > 0 then keep_slot_keys(KEYS[1], KEYS[2], ttl_ms) end
local out = {redis.call('ZCARD', KEYS[3])}
for _, body in ipairs(bodies) do out[#out + 1] = body end
return out
