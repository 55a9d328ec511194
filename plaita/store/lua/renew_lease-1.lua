-- Compare-and-extend one lease.
-- KEYS[1]  lease key
-- ARGV[1]  the value it must still hold
-- ARGV[2]  new ttl (ms)
-- Returns  1 extended, 0 lost (another holder, expired, or replaced by a key of another type:
--          pcall answers that GET with an error table, which equals no value)
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
end
return 0
