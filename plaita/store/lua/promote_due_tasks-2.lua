-- Move a queue partition's due named tasks (retries, delayed enqueues) onto its stream
-- (plaita.store.task_store).
-- KEYS[1]  due set: a sorted set, member = the task's JSON body, score = its due time (unix ms)
-- KEYS[2]  the partition's stream (same hash tag as KEYS[1])
-- ARGV[1]  now (unix ms)
-- ARGV[2]  at most this many moved per call
-- ARGV[3]  schema_version of the entries written
-- Returns  how many were moved. One script, so two workers promoting at once move each task once.
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, body in ipairs(due) do
  redis.call('XADD', KEYS[2], '*', 'payload', body, 'schema_version', ARGV[3])
  redis.call('ZREM', KEYS[1], body)
end
return #due
