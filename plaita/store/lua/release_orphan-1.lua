-- Delete a lease this incarnation holds under any generation (its acquire reply was lost).
-- KEYS[1]  lease key
-- ARGV[1]  holder (worker:{consumer}@{incarnation})
-- Returns  1 if deleted, else 0 (also for a key of another type: pcall answers its GET with an
--          error table, not ours)
local cur = redis.pcall('GET', KEYS[1])
if type(cur) == 'string' and string.sub(cur, 1, string.len(ARGV[1]) + 1) == ARGV[1] .. ':' then
  return redis.call('DEL', KEYS[1])
end
return 0
