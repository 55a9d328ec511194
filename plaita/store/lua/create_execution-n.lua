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
--- @include "index_write"
if not holds_fence(KEYS[1], KEYS[2], ARGV[1]) then return {0, '', 0} end
local cancel = redis.call('EXISTS', KEYS[5])
-- Each key's type is checked by a read the script needs anyway (GET, ZSCORE: a wrong-typed key
-- fails it, pcall turns that into the reply), not by a TYPE each: half the commands. The order
-- of the replies stays that of the keys (3, 4, 6, 7, 8); the running index (4) is checked by the
-- first write, a ZADD that fails alone, or by TYPE when another reply is due.
local existing = redis.pcall('GET', KEYS[3])
if type(existing) == 'table' then return {4, KEYS[3], cancel} end
-- Whether each index (queued, error) holds this execution: only then is it removed from it.
local listed = {}
local reply = nil
for i = 6, 7 do
  local score = redis.pcall('ZSCORE', KEYS[i], ARGV[4])
  if type(score) == 'table' then reply = {4, KEYS[i], cancel}; break end
  listed[i] = score
end
local other = false
if not reply and #KEYS >= 8 then
  other = redis.pcall('GET', KEYS[8])
  if type(other) == 'table' then reply = {4, KEYS[8], cancel} end
end
if not reply and existing then
  -- Only a producer's queued record (or its dead-lettered end) is replaced; anything else is
  -- reported as it is.
  local ok, doc = pcall(cjson.decode, existing)
  local queued = ok and type(doc) == 'table' and (doc.status == 'queued' or
    (doc.status == 'error' and type(doc.error) == 'table' and doc.error.type == 'DeadLettered'))
  if not queued then reply = {3, existing, cancel} end
end
if not reply and other and other ~= ARGV[4] then reply = {2, other, cancel} end
if reply then
  local t = redis.call('TYPE', KEYS[4]).ok
  if t ~= 'none' and t ~= 'zset' then return {4, KEYS[4], cancel} end
  return reply
end
local refused = index_write(KEYS[4], ARGV[3], ARGV[4])
if refused == 'wrong' then return {4, KEYS[4], cancel} elseif refused then return refused end
redis.call('SET', KEYS[3], ARGV[2])
if listed[6] then redis.call('ZREM', KEYS[6], ARGV[4]) end
if listed[7] then redis.call('ZREM', KEYS[7], ARGV[4]) end
if #KEYS >= 8 then redis.call('SET', KEYS[8], ARGV[4], 'EX', ARGV[5]) end
return {1, '', cancel}
