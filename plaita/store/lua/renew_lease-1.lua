-- Compare-and-extend one lease, in whichever format it was written (includes/fence.lua).
-- KEYS[1]  lease key
-- ARGV[1]  the lease as its holder knows it: '<holder>:<generation>'
-- ARGV[2]  new ttl (ms)
-- ARGV[3]  a v2 key's PX (ms): 7 days + the lease TTL, so the key outlives the lease
-- Returns  1 extended, 0 lost (another holder, expired, or replaced by a key of another type:
--          pcall answers that GET with an error table, which equals no value)
--- @include "fence"
local cur = redis.pcall('GET', KEYS[1])
if type(cur) ~= 'string' then return 0 end
if cur == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
end
local gen, expiry, holder = lease_v2(cur)
if gen and holder .. ':' .. gen == ARGV[1] and tonumber(expiry) > now_ms() then
  local value = 'v2|' .. gen .. '|' .. string.format('%d', now_ms() + tonumber(ARGV[2])) .. '|' .. holder
  redis.call('SET', KEYS[1], value, 'PX', tonumber(ARGV[3]))
  return 1
end
return 0
