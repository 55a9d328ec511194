-- A suspect's turn to run alone (plaita.store.executions.crashes): count the crash it was in flight for and
-- arm the record for this run, in one call.
-- KEYS[1]  the task's crash-strike hash (count, armed)
-- ARGV[1]  the entry's message id
-- ARGV[2]  max crashes: at or above it, with this crash blamed, the record is not armed again
-- ARGV[3]  TTL of the record, ms
-- ARGV[4]  1 when the entry was the only one its dead predecessor had pending (a lone suspect: the
--          only candidate, so the crash is blamed on it at once), else 0
-- Returns  {count, blamed}: blamed 1 when the record was armed for this very entry, i.e. the
--          process died while the entry ran alone, or when the entry is a lone suspect
local armed = redis.call('HGET', KEYS[1], 'armed')
local count = tonumber(redis.call('HGET', KEYS[1], 'count') or '0') or 0
local blamed = 0
if armed == ARGV[1] or ARGV[4] == '1' then
  count = count + 1
  blamed = 1
elseif count == 0 then
  count = 1
end
redis.call('HSET', KEYS[1], 'count', count)
if blamed == 1 and count >= tonumber(ARGV[2]) then
  redis.call('HDEL', KEYS[1], 'armed')
else
  redis.call('HSET', KEYS[1], 'armed', ARGV[1])
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {count, blamed}
