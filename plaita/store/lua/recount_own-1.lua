-- Set the delivery count of entries still pending for this consumer (XCLAIM RETRYCOUNT … JUSTID to
-- itself), never pulling back an entry another consumer has claimed: a crash's re-read is not a
-- delivery (plaita.runtime.suspects).
-- KEYS[1]  stream
-- ARGV[1]  group
-- ARGV[2]  this consumer
-- ARGV[3…] pairs: entry id, delivery count to set
-- Returns  the ids set
local done = {}
for i = 3, #ARGV, 2 do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if #p > 0 and p[1][2] == ARGV[2] then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'RETRYCOUNT', ARGV[i + 1], 'JUSTID')
    table.insert(done, ARGV[i])
  end
end
return done
