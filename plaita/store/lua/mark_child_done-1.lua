-- Record that one child of a spawn has ended (fan-in), in the parent's slot.
-- KEYS[1]  the spawn's done set (plaita:execution:children:...); a string once the parent joined
-- ARGV[1]  the child's index
-- Returns  how many of the spawn's children have ended (a repeated index counts once), or -1
--          when the parent has joined them already (a late, repeated notification)
local kind = redis.call('TYPE', KEYS[1]).ok
if kind == 'string' then
  return -1
end
if kind ~= 'set' and kind ~= 'none' then
  return redis.error_reply('WRONGTYPE ' .. KEYS[1] .. ' is not a set')
end
redis.call('SADD', KEYS[1], ARGV[1])
return redis.call('SCARD', KEYS[1])
