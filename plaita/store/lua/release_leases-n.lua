-- Compare-and-delete many leases: each is deleted only while it still holds our exact value.
-- A key of another type is not ours: skipped, never an error that would fail the batch.
-- KEYS[i]  lease key i
-- ARGV[i]  the value lease i must still hold
-- Returns  how many were deleted
local n = 0
for i = 1, #KEYS do
  if redis.call('TYPE', KEYS[i]).ok == 'string' and redis.call('GET', KEYS[i]) == ARGV[i] then
    n = n + redis.call('DEL', KEYS[i])
  end
end
return n
