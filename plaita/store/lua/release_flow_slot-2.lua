-- Give back a flow slot (compare-and-delete: only the task that took it gives it back).
-- KEYS[1]  the flow's slot set (zset)
-- KEYS[2]  the flow's slot owners (hash)
-- ARGV[1]  execution id
-- ARGV[2]  the token it was taken with
-- Returns  1 released, 0 not ours (expired, or taken over by the execution's next task)
if redis.call('TYPE', KEYS[2]).ok == 'hash' and redis.call('HGET', KEYS[2], ARGV[1]) == ARGV[2] then
  redis.call('HDEL', KEYS[2], ARGV[1])
  if redis.call('TYPE', KEYS[1]).ok == 'zset' then
    redis.call('ZREM', KEYS[1], ARGV[1])
  end
  return 1
end
return 0
