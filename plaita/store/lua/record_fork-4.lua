-- A fork (``FlowClient.fork``): the new execution's document, written `running` at the step it
-- starts from, its entry in the running index and its start task, in one atomic step. The new id
-- must be free: a fork never overwrites an execution. Every key is the new execution's (its hash
-- tag), so the script is single-slot on a cluster; the original is only read, before, by the caller.
-- KEYS[1]  the new execution's state
-- KEYS[2]  running index (sorted set) of its partition
-- KEYS[3]  the partition's stream
-- KEYS[4]  the new execution's events hash (replaced by the events copied, ARGV[8..])
-- ARGV[1]  the new execution id (the index member)
-- ARGV[2]  its document (JSON, status running)
-- ARGV[3]  now (epoch seconds; the index score)
-- ARGV[4]  the task's payload field value (the start body, JSON)
-- ARGV[5]  the task's schema_version field value
-- ARGV[6]  the payload field name
-- ARGV[7]  the schema_version field name
-- ARGV[8..] name, record (JSON) pairs: the events of the copied steps
-- Returns  {1, stream id} written and enqueued; {2, ''} the id is taken (nothing written);
--          {4, key} key <key> holds the wrong type (nothing written)
local want = {[1] = 'string', [2] = 'zset', [3] = 'stream', [4] = 'hash'}
for i = 1, #KEYS do
  local t = redis.call('TYPE', KEYS[i]).ok
  if t ~= 'none' and t ~= want[i] then return {4, KEYS[i]} end
end
if redis.call('EXISTS', KEYS[1]) == 1 then return {2, ''} end
redis.call('SET', KEYS[1], ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
redis.call('DEL', KEYS[4])
for i = 8, #ARGV, 2 do redis.call('HSET', KEYS[4], ARGV[i], ARGV[i + 1]) end
return {1, redis.call('XADD', KEYS[3], '*', ARGV[6], ARGV[4], ARGV[7], ARGV[5])}
