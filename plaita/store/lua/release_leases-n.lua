-- Compare-and-delete many leases: each is deleted only while it still holds our exact value.
-- One MGET reads them all and one DEL deletes the ones still ours (commands run inside a script
-- cost redis-server like any other, so two per batch instead of a GET and a DEL per lease). A
-- key of another type reads as nil in MGET: not ours, skipped, never an error that would fail
-- the batch.
-- KEYS[i]  lease key i
-- ARGV[i]  the value lease i must still hold
-- Returns  how many were deleted
local n = 0
-- In slices: unpack of thousands of keys would overflow Lua's C stack.
for first = 1, #KEYS, 1000 do
  local last = math.min(first + 999, #KEYS)
  local vals = redis.call('MGET', unpack(KEYS, first, last))
  local ours = {}
  for j = 1, #vals do
    if vals[j] == ARGV[first + j - 1] then ours[#ours + 1] = KEYS[first + j - 1] end
  end
  if #ours > 0 then n = n + redis.call('DEL', unpack(ours)) end
end
return n
