-- Release a lease this incarnation holds under any generation (its acquire reply was lost): a v1
-- one is deleted, a v2 one rewritten free with its generation kept (includes/fence.lua).
-- KEYS[1]  lease key
-- ARGV[1]  holder (worker:{consumer}@{incarnation})
-- Returns  1 if released, else 0 (also for a key of another type: pcall answers its GET with an
--          error table, not ours)
--- @include "fence"
local cur = redis.pcall('GET', KEYS[1])
if type(cur) ~= 'string' then return 0 end
if string.sub(cur, 1, string.len(ARGV[1]) + 1) == ARGV[1] .. ':' then
  return redis.call('DEL', KEYS[1])
end
local gen, _, holder = lease_v2(cur)
if gen and holder == ARGV[1] then
  redis.call('SET', KEYS[1], 'v2|' .. gen .. '|0|', 'KEEPTTL')
  return 1
end
return 0
