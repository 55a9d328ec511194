-- Acquire the leases of a whole read batch, each with a new fencing generation.
-- A lease held by another holder is refused; one of this consumer's previous incarnation (a
-- restarted worker with the same stable name) is taken over; one this incarnation already holds
-- is refused too (a second task of the same execution must wait like on any other worker).
-- A lease or fence key that is not a plaita lease (another type, a fence that is no integer, a
-- value without TTL) is refused with a reply starting with '!': one bad key blocks only its
-- own execution, never the batch.
-- KEYS[2i-1]  lease key of execution i
-- KEYS[2i]    fence counter of execution i
-- ARGV[1]     holder (worker:{consumer}@{incarnation})
-- ARGV[2]     lease ttl (ms)
-- ARGV[3]     fence counter ttl (s)
-- ARGV[4]     takeover prefix (worker:{consumer}@)
-- Returns     flat {1, generation | 0, current value or '!why', ...}, one pair per execution
local out = {}
local function refuse(why)
  table.insert(out, 0)
  table.insert(out, why)
end
for i = 1, #KEYS, 2 do
  local lt = redis.call('TYPE', KEYS[i]).ok
  local ft = redis.call('TYPE', KEYS[i + 1]).ok
  local cur = nil
  if lt == 'string' then cur = redis.call('GET', KEYS[i]) end
  if (lt ~= 'string' and lt ~= 'none') or (ft ~= 'string' and ft ~= 'none') then
    refuse('!wrongtype lease=' .. lt .. ' fence=' .. ft)
  elseif ft == 'string' and not tonumber(redis.call('GET', KEYS[i + 1])) then
    refuse('!fence is not an integer')
  elseif cur and redis.call('PTTL', KEYS[i]) == -1 then
    refuse('!no ttl: ' .. string.sub(cur, 1, 100))
  elseif cur and (string.sub(cur, 1, string.len(ARGV[4])) ~= ARGV[4]
      or string.sub(cur, 1, string.len(ARGV[1]) + 1) == ARGV[1] .. ':') then
    refuse(cur)
  else
    local gen = redis.call('INCR', KEYS[i + 1])
    redis.call('EXPIRE', KEYS[i + 1], tonumber(ARGV[3]))
    redis.call('SET', KEYS[i], ARGV[1] .. ':' .. gen, 'PX', tonumber(ARGV[2]))
    table.insert(out, 1)
    table.insert(out, gen)
  end
end
return out
