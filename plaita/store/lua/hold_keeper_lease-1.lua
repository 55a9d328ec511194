-- Take or renew the acting keeper's lease.
-- KEYS[1]  keeper lease
-- ARGV[1]  holder
-- ARGV[2]  TTL in ms
-- Returns  1 if this holder holds it now (renewed or taken), else 0
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', tonumber(ARGV[2])) then return 1 end
return 0
