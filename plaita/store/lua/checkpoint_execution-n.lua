-- One step's checkpoint of a flow execution, fenced: written only while the writer's lease
-- generation still holds the execution and no newer generation exists. Writes the state, the
-- status index, the suspension deadline and the step's staged writes together: all or nothing.
-- Redis does not roll back a script whose later command fails, so nothing after the first write
-- may fail: the caller checked every value (TTLs, increments, deadline, state size); the staged
-- keys (type, and for INCRBY the integer value and range) and the deadlines index are checked
-- here; the first write is the ZADD to the status index, which fails alone if that key is not
-- a sorted set; a ZREM from a wrong-typed index has nothing to remove and is ignored.
-- KEYS[1]  lease key
-- KEYS[2]  fence counter
-- KEYS[3]  execution state
-- KEYS[4]  cancel flag (deleted once terminal)
-- KEYS[5]  suspension deadlines (sorted set)
-- KEYS[6..10]  status index sets: running, suspended, completed, error, cancelled
-- KEYS[11..]   one key per staged write
-- KEYS[11+n]   optional, after the n staged keys: the execution's events hash (given the
--              retention with the state once terminal)
-- KEYS[12+n]   optional, after the events hash: the partition's index keeps (sorted set: how
--              long a writer's index keeps entries, in seconds, scored by when it last trimmed)
-- ARGV[1]  the writer's generation
-- ARGV[2]  state JSON
-- ARGV[3]  status, 1-based index into KEYS[6..10]
-- ARGV[4]  now (epoch seconds, whole for `running`; the index score)
-- ARGV[5]  execution id (the index member)
-- ARGV[6]  deadline (epoch seconds) or '' for none
-- ARGV[7]  retention seconds when terminal, else 0
-- ARGV[8]  number of staged writes, then per write: op (set | incrby | rpush), value, ttl_s
--          (0 = none), and what the key must hold now: '' anything, 'list' a list or nothing,
--          'int:<lo>:<hi>' nothing or an integer string in [lo, hi]
-- ARGV[9+4n] optional: index entries older than this many seconds are dropped from the status
--          index once terminal (0: none); absent, ARGV[7] (a flow kept longer stays listed).
--          With the index keeps key, the longest keep any writer trimmed with within that keep
--          (0 if one keeps for ever) is used instead, when longer: a worker of short flows never
--          drops the entries a worker of longer ones wrote in the same tenant (a mixed fleet).
-- Returns  {1, cancel_requested} written; {0, 0} refused (fenced out, also when the lease or
--          fence key is not a string); {2, key, why} a staged write Redis would refuse; {3, key,
--          why} an index key of the wrong type; {4, 1} refused: a `completed` result while the
--          cancel flag is set (the cancel came during the last step: the caller writes
--          `cancelled` instead). Nothing is written unless the reply is {1, ...}.
--- @include "fence"
--- @include "index_write"
if not holds_fence(KEYS[1], KEYS[2], ARGV[1]) then return {0, 0} end
local status = tonumber(ARGV[3])
if status == 3 and redis.call('EXISTS', KEYS[4]) == 1 then return {4, 1} end
local function kind(key) return redis.call('TYPE', key).ok end
-- Signed decimal integers without leading zeros (Redis's own format), compared exactly.
local function cmp(a, b)
  local na, nb = string.sub(a, 1, 1) == '-', string.sub(b, 1, 1) == '-'
  if na ~= nb then return na and -1 or 1 end
  local r = 0
  if #a ~= #b then r = (#a < #b) and -1 or 1 elseif a ~= b then r = (a < b) and -1 or 1 end
  return na and -r or r
end
local function refusal(key, need)
  if need == '' then return nil end
  if need == 'list' then
    local t = kind(key)
    if t ~= 'none' and t ~= 'list' then return 'RPUSH on a key holding a ' .. t end
    return nil
  end
  local v = redis.pcall('GET', key)
  if type(v) == 'table' then return 'INCRBY on a key holding a ' .. kind(key) end
  v = v or '0'
  if not (v == '0' or string.match(v, '^%-?[1-9]%d*$')) then return 'INCRBY on a value that is not an integer' end
  local lo, hi = string.match(need, '^int:(%-?%d+):(%-?%d+)$')
  if cmp(v, lo) < 0 or cmp(v, hi) > 0 then return 'INCRBY on ' .. v .. ' would overflow signed 64 bits' end
  return nil
end
local function wrong_index(key)
  return {3, key, 'holds a ' .. kind(key) .. ', not a sorted set'}
end
-- ARGV[4] and a score as numbers: `+ 0` (Lua's one parse), not tonumber (which parses twice,
-- glibc's slow path for 17 digits), once the index ZADD took ARGV[4] as a score: the same value.
-- Record ``keep`` (seconds; 0 for ever) as used now and return the longest keep still owed: one
-- a writer used less than that long ago (entries it wrote may be younger than it). Others are
-- dropped. pcall: a wrong-typed keeps key leaves the trim to ``keep`` (this runs after the writes).
-- ``now`` is ARGV[4] as a number, and the score sent is ARGV[4] itself: the same double, without
-- Redis printing the number back ('%.17g').
local function longest_keep(key, keep, now)
  redis.pcall('ZADD', key, ARGV[4], string.format('%d', keep))
  local seen = redis.pcall('ZRANGE', key, 0, -1, 'WITHSCORES')
  if type(seen) ~= 'table' or seen.err then return keep end
  for i = 1, #seen, 2 do
    local k, at = tonumber(seen[i]), seen[i + 1] + 0  -- a score Redis printed: a number
    if k == 0 then keep = 0
    elseif at > now - k then
      if keep > 0 and k > keep then keep = k end
    else redis.pcall('ZREM', key, seen[i]) end
  end
  return keep
end
local n = tonumber(ARGV[8])
for i = 1, n do
  local why = refusal(KEYS[10 + i], ARGV[4 * i + 8])
  if why then return {2, KEYS[10 + i], why} end
end
if ARGV[6] ~= '' then
  local t = kind(KEYS[5])
  if t ~= 'zset' and t ~= 'none' then return wrong_index(KEYS[5]) end
end
local retention = tonumber(ARGV[7])
local index = KEYS[5 + status]
local refused = index_write(index, ARGV[4], ARGV[5])
if refused == 'wrong' then return wrong_index(index) elseif refused then return refused end
redis.call('SET', KEYS[3], ARGV[2])
for i = 1, 5 do
  if i ~= status then redis.pcall('ZREM', KEYS[5 + i], ARGV[5]) end
end
if ARGV[6] ~= '' then redis.call('ZADD', KEYS[5], ARGV[6], ARGV[5])
else redis.pcall('ZREM', KEYS[5], ARGV[5]) end
local keep = tonumber(ARGV[9 + 4 * n] or retention)
if #KEYS > 11 + n then  -- terminal (kept for ever too): record this keep, trim by the longest owed
  local now = ARGV[4] + 0
  keep = longest_keep(KEYS[12 + n], keep, now)
  if keep > 0 then redis.call('ZREMRANGEBYSCORE', index, '-inf', string.format('%d', now - keep)) end
elseif retention > 0 and keep > 0 then
  redis.call('ZREMRANGEBYSCORE', index, '-inf', string.format('%d', ARGV[4] - keep))
end
-- Numbers go to Redis as strings made here ('%d') or as they came (ARGV): a Lua number passed
-- to redis.call is printed with '%.17g' by Redis 7.0, a slow path of printf for every one.
-- The cancel flag is known absent after a `completed` write (checked above; nothing since wrote
-- it), so neither its DEL nor, without staged writes (any key), the EXISTS of the reply is sent.
if retention > 0 then
  redis.call('EXPIRE', KEYS[3], ARGV[7])
  if status ~= 3 then redis.call('DEL', KEYS[4]) end
  if #KEYS > 10 + n then redis.call('EXPIRE', KEYS[11 + n], ARGV[7]) end
end
for i = 1, n do
  local key, op, value, ttl = KEYS[10 + i], ARGV[4 * i + 5], ARGV[4 * i + 6], ARGV[4 * i + 7]
  if op == 'set' then redis.call('SET', key, value)
  elseif op == 'incrby' then redis.call('INCRBY', key, value)
  else redis.call('RPUSH', key, value) end
  if tonumber(ttl) > 0 then redis.call('EXPIRE', key, ttl) end
end
if n == 0 and (retention > 0 or status == 3) then return {1, 0} end
return {1, redis.call('EXISTS', KEYS[4])}
