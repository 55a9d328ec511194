-- One step's checkpoint of a flow execution, fenced: written only while the writer's lease
-- generation still holds the execution and no newer generation exists. Writes the state, the
-- status index, the suspension deadline and the step's staged writes together.
-- KEYS[1]  lease key
-- KEYS[2]  fence counter
-- KEYS[3]  execution state
-- KEYS[4]  cancel flag (deleted once terminal)
-- KEYS[5]  suspension deadlines (sorted set)
-- KEYS[6..10]  status index sets: running, suspended, completed, error, cancelled
-- KEYS[11..]   one key per staged write
-- ARGV[1]  the writer's generation
-- ARGV[2]  state JSON
-- ARGV[3]  status, 1-based index into KEYS[6..10]
-- ARGV[4]  now (epoch seconds; the index score)
-- ARGV[5]  execution id (the index member)
-- ARGV[6]  deadline (epoch seconds) or '' for none
-- ARGV[7]  retention seconds when terminal, else 0
-- ARGV[8]  number of staged writes, then per write: op (set | incrby | rpush), value, ttl_s (0 = none)
-- Returns  {1, cancel_requested} written, {0, 0} refused
local cur = redis.call('GET', KEYS[1])
local fence = tonumber(redis.call('GET', KEYS[2]) or '0')
if fence ~= tonumber(ARGV[1]) or not cur then return {0, 0} end
local suffix = ':' .. ARGV[1]
if string.sub(cur, -string.len(suffix)) ~= suffix then return {0, 0} end
local status = tonumber(ARGV[3])
local retention = tonumber(ARGV[7])
redis.call('SET', KEYS[3], ARGV[2])
for i = 1, 5 do
  if i == status then redis.call('ZADD', KEYS[5 + i], ARGV[4], ARGV[5])
  else redis.call('ZREM', KEYS[5 + i], ARGV[5]) end
end
if ARGV[6] ~= '' then redis.call('ZADD', KEYS[5], ARGV[6], ARGV[5])
else redis.call('ZREM', KEYS[5], ARGV[5]) end
if retention > 0 then
  redis.call('EXPIRE', KEYS[3], retention)
  redis.call('ZREMRANGEBYSCORE', KEYS[5 + status], '-inf', tonumber(ARGV[4]) - retention)
  redis.call('DEL', KEYS[4])
end
for i = 1, tonumber(ARGV[8]) do
  local key, op, value, ttl = KEYS[10 + i], ARGV[3 * i + 6], ARGV[3 * i + 7], tonumber(ARGV[3 * i + 8])
  if op == 'set' then redis.call('SET', key, value)
  elseif op == 'incrby' then redis.call('INCRBY', key, value)
  else redis.call('RPUSH', key, value) end
  if ttl > 0 then redis.call('EXPIRE', key, ttl) end
end
return {1, redis.call('EXISTS', KEYS[4])}
