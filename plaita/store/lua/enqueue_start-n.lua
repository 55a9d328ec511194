-- A producer's start, in one atomic step: answer its dedup key, record the execution as
-- `queued` (document and status index) and add the start task to the stream. Two starts with one
-- dedup key, however close, get one execution id: the second is answered with the first's id and
-- adds nothing. A start of an id that exists already is enqueued as before (a worker decides:
-- a no-op, or it continues a running one) and its document is left as it is. Every key is in
-- the execution's hash tag (the producer picks the id in its dedup key's partition), so the
-- script is single-slot on a cluster. All or nothing: every key's type is checked first. The
-- record expires with its dedup key unless a worker takes it over first (a start whose task was
-- lost otherwise is not shown queued for ever); entries of expired records leave the index here.
-- A delayed start (ARGV[9] > 0) is recorded the same way but its task goes to the partition's
-- delayed set instead, scored by its due time; a worker's reclaim pass moves it on when due.
-- KEYS[1]  execution state
-- KEYS[2]  queued index (sorted set)
-- KEYS[3]  the partition's stream, or its delayed set (sorted set) for a delayed start
-- KEYS[4]  start dedup key (optional)
-- ARGV[1]  execution id
-- ARGV[2]  the queued document (JSON)
-- ARGV[3]  now (epoch seconds; the index score)
-- ARGV[4]  the task's payload field value (the start body, JSON)
-- ARGV[5]  the task's schema_version field value
-- ARGV[6]  TTL in seconds of the dedup key and of the queued record
-- ARGV[7]  the payload field name
-- ARGV[8]  the schema_version field name
-- ARGV[9]  due time in epoch ms of a delayed start; 0 (or absent): enqueue now
-- ARGV[10] the delayed member ("<id> <schema_version> <payload>"; a delayed start only)
-- Returns  {1, stream id} recorded and enqueued (a delayed start: the delayed member); {2, id} the dedup key is held by execution <id>
--          (nothing written); {3, stream id} the execution existed: enqueued, document kept;
--          {4, key} key <key> holds the wrong type (nothing written)
local due_ms = tonumber(ARGV[9] or '0')
local want = {[1] = 'string', [2] = 'zset', [3] = (due_ms > 0) and 'zset' or 'stream', [4] = 'string'}
for i = 1, #KEYS do
  local t = redis.call('TYPE', KEYS[i]).ok
  if t ~= 'none' and t ~= want[i] then return {4, KEYS[i]} end
end
if #KEYS >= 4 then
  local holder = redis.call('GET', KEYS[4])
  if holder then return {2, holder} end
end
local function add()
  if due_ms > 0 then
    redis.call('ZADD', KEYS[3], due_ms, ARGV[10])
    return ARGV[10]
  end
  return redis.call('XADD', KEYS[3], '*', ARGV[7], ARGV[4], ARGV[8], ARGV[5])
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {3, add()}
end
redis.call('SET', KEYS[1], ARGV[2], 'EX', tonumber(ARGV[6]))
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', tonumber(ARGV[3]) - tonumber(ARGV[6]))
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
if #KEYS >= 4 then redis.call('SET', KEYS[4], ARGV[1], 'EX', tonumber(ARGV[6])) end
return {1, add()}
