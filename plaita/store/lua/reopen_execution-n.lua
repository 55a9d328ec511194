-- A restart of a terminal execution (``plaita executions retry``), fenced like a checkpoint:
-- written only while the writer's lease generation holds the execution. Puts it back in the
-- running index (out of the terminal ones and the deadlines), writes its state with no TTL (SET
-- drops the retention EXPIRE: a running execution never expires; PERSIST its events) and deletes its cancel flag
-- (a cancelled execution would otherwise be cancelled again at once). All or nothing: the one
-- command that can fail (the ZADD, on a wrong-typed index) is checked before the first write.
-- KEYS[1]  lease key
-- KEYS[2]  fence counter
-- KEYS[3]  execution state
-- KEYS[4]  cancel flag
-- KEYS[5]  suspension deadlines (sorted set)
-- KEYS[6..10]  status index sets: running, suspended, completed, error, cancelled
-- KEYS[11]  optional: the execution's events hash (its retention TTL dropped with the state's, so
--           events published before the end do not expire while the execution runs again)
-- ARGV[1]  the writer's generation
-- ARGV[2]  state JSON (status running)
-- ARGV[3]  now (epoch seconds; the index score)
-- ARGV[4]  execution id (the index member)
-- ARGV[5..] the steps that run again (the restart's step and those after it): the events they
--           published are deleted, as their results are, so a reader never takes the previous
--           run's progress for the new run's (a record that is not a JSON object is kept)
-- Returns  {1} written; {0} refused (fenced out); {3, key, why} the running index holds the
--          wrong type. Nothing is written unless the reply is {1}.
--- @include "fence"
if not holds_fence(KEYS[1], KEYS[2], ARGV[1]) then return {0} end
local t = redis.call('TYPE', KEYS[6]).ok
if t ~= 'zset' and t ~= 'none' then return {3, KEYS[6], 'holds a ' .. t .. ', not a sorted set'} end
redis.call('ZADD', KEYS[6], ARGV[3], ARGV[4])
redis.call('SET', KEYS[3], ARGV[2])
for i = 7, 10 do redis.pcall('ZREM', KEYS[i], ARGV[4]) end
redis.pcall('ZREM', KEYS[5], ARGV[4])
redis.call('DEL', KEYS[4])
if #KEYS >= 11 then
  redis.call('PERSIST', KEYS[11])
  if #ARGV > 4 and redis.call('TYPE', KEYS[11]).ok == 'hash' then
    local rerun = {}
    for i = 5, #ARGV do rerun[ARGV[i]] = true end
    local fields = redis.call('HGETALL', KEYS[11])
    for i = 1, #fields, 2 do
      local ok, record = pcall(cjson.decode, fields[i + 1])
      if ok and type(record) == 'table' and type(record.step) == 'string' and rerun[record.step] then
        redis.call('HDEL', KEYS[11], fields[i])
      end
    end
  end
end
return {1}
