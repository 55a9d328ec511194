-- Delete a start dedup key only while it still names the execution being deleted (another
-- execution's claim on the same key, made after this one's expired, is left alone).
-- KEYS[1]  start dedup key
-- ARGV[1]  execution id
-- Returns  1 deleted, 0 left (names another execution, is gone, or is not a string)
local cur = redis.pcall('GET', KEYS[1])
if type(cur) == 'string' and cur == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
