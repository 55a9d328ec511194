-- Reset the idle time of entries still pending for this consumer (XCLAIM JUSTID to itself: the
-- delivery count is untouched), never pulling back an entry a successor has claimed.
-- KEYS[1]  stream
-- ARGV[1]  group
-- ARGV[2]  this consumer
-- ARGV[3…] entry ids
-- Returns  the ids renewed
local renewed = {}
for i = 3, #ARGV do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if #p > 0 and p[1][2] == ARGV[2] then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')
    table.insert(renewed, ARGV[i])
  end
end
return renewed
