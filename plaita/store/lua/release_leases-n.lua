-- Compare-and-delete many leases: each is released only while it still holds our exact lease.
-- One MGET reads them all and one DEL deletes the v1 ones still ours (commands run inside a
-- script cost redis-server like any other, so two per batch instead of a GET and a DEL per
-- lease); a v2 one still ours is rewritten with expiry 0 (free, its generation kept: see
-- includes/fence.lua). A key of another type reads as nil in MGET: not ours, skipped, never an
-- error that would fail the batch.
-- KEYS[i]  lease key i
-- ARGV[i]  '<holder>:<generation>': the lease i must still be
-- Returns  how many were released
--- @include "fence"
local n = 0
-- In slices: unpack of thousands of keys would overflow Lua's C stack.
for first = 1, #KEYS, 1000 do
  local last = math.min(first + 999, #KEYS)
  local vals = redis.call('MGET', unpack(KEYS, first, last))
  local ours = {}
  for j = 1, #vals do
    local cur, want, key = vals[j], ARGV[first + j - 1], KEYS[first + j - 1]
    if cur == want then
      ours[#ours + 1] = key
    elseif cur then
      local gen, _, holder = lease_v2(cur)
      if gen and holder .. ':' .. gen == want then
        redis.call('SET', key, 'v2|' .. gen .. '|0|', 'KEEPTTL')
        n = n + 1
      end
    end
  end
  if #ours > 0 then n = n + redis.call('DEL', unpack(ours)) end
end
return n
