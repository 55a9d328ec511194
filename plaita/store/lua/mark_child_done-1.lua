-- Record that one child of a spawn has ended (fan-in), in the parent's slot.
-- KEYS[1]  the spawn's done set (plaita:execution:children:...)
-- ARGV[1]  the child's index
-- ARGV[2]  ttl (s) of the set
-- Returns  how many of the spawn's children have ended (a repeated index counts once)
if redis.call('TYPE', KEYS[1]).ok ~= 'set' and redis.call('EXISTS', KEYS[1]) == 1 then
  return redis.error_reply('WRONGTYPE ' .. KEYS[1] .. ' is not a set')
end
redis.call('SADD', KEYS[1], ARGV[1])
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[2]))
return redis.call('SCARD', KEYS[1])
