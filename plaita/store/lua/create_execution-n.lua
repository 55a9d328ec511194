-- Create a flow execution under its lease (fenced like a checkpoint), or report why not. A
-- start's one round trip: it also returns an existing execution's state and the cancel flag.
-- All or nothing: every key is checked before the first write. A `queued` document (what a
-- producer records at start: plaita.store.executions.store.ExecutionStore.enqueue_start) is taken over:
-- replaced by the running one and moved from the queued index to the running one, in this call;
-- so is one that ended `error` because its start was dead-lettered (a requeued start runs).
-- KEYS[1]  lease key
-- KEYS[2]  fence counter
-- KEYS[3]  execution state
-- KEYS[4]  running index set
-- KEYS[5]  cancel flag
-- KEYS[6]  queued index set
-- KEYS[7]  error index set
-- KEYS[8]  start dedup key (optional)
-- ARGV[1]  the writer's generation
-- ARGV[2]  state JSON
-- ARGV[3]  now (whole epoch seconds; the running index score)
-- ARGV[4]  execution id
-- ARGV[5]  dedup key TTL in seconds
-- Returns  {code, text, cancel_requested}: 1 created (or a queued record taken over); 0 refused (fenced out, also when the
--          lease or fence key is not a string); 2 the dedup key started execution <text>; 3 the
--          execution exists and <text> is its state; 4 key <text> holds the wrong type (nothing
--          written)
--- @include "fence"
if not holds_fence(KEYS[1], KEYS[2], ARGV[1]) then return {0, '', 0} end
local function kind(key) return redis.call('TYPE', key).ok end
local cancel = redis.call('EXISTS', KEYS[5])
local want = {[3] = 'string', [4] = 'zset', [6] = 'zset', [7] = 'zset', [8] = 'string'}
for i = 3, #KEYS do
  local t = kind(KEYS[i])
  if want[i] and t ~= 'none' and t ~= want[i] then return {4, KEYS[i], cancel} end
end
local existing = redis.call('GET', KEYS[3])
if existing then
  -- Only a producer's queued record (or its dead-lettered end) is replaced; anything else is
  -- reported as it is.
  local ok, doc = pcall(cjson.decode, existing)
  local queued = ok and type(doc) == 'table' and (doc.status == 'queued' or
    (doc.status == 'error' and type(doc.error) == 'table' and doc.error.type == 'DeadLettered'))
  if not queued then return {3, existing, cancel} end
end
if #KEYS >= 8 then
  local other = redis.call('GET', KEYS[8])
  if other and other ~= ARGV[4] then return {2, other, cancel} end
end
redis.call('SET', KEYS[3], ARGV[2])
redis.call('ZADD', KEYS[4], ARGV[3], ARGV[4])
redis.call('ZREM', KEYS[6], ARGV[4])
redis.call('ZREM', KEYS[7], ARGV[4])
if #KEYS >= 8 then redis.call('SET', KEYS[8], ARGV[4], 'EX', ARGV[5]) end
return {1, '', cancel}
