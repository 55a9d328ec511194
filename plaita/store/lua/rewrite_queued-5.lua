-- Rewrite a `queued` execution record under the start's lease (fenced like a checkpoint): what
-- it waits for (still queued), or its end when its start is dead-lettered (`error`), so a queued
-- record never outlives its task. Refused unless the document is still `queued`: a worker that
-- took it over (create_execution) owns it from then on.
-- KEYS[1]  lease key
-- KEYS[2]  fence counter
-- KEYS[3]  execution state
-- KEYS[4]  queued index set
-- KEYS[5]  the index set of the new status (KEYS[4] again while it stays queued)
-- ARGV[1]  the writer's generation
-- ARGV[2]  the new document (JSON)
-- ARGV[3]  now (epoch seconds; the index score)
-- ARGV[4]  execution id (the index member)
-- ARGV[5]  retention seconds of the document (0: it stays queued and keeps the TTL it has)
-- Returns  1 written; 0 refused (fenced out, no document, or not a queued one; also when an
--          index holds the wrong type: nothing is written then)
--- @include "fence"
if not holds_fence(KEYS[1], KEYS[2], ARGV[1]) then return 0 end
local raw = redis.pcall('GET', KEYS[3])
if type(raw) ~= 'string' then return 0 end
local ok, doc = pcall(cjson.decode, raw)
if not (ok and type(doc) == 'table' and doc.status == 'queued') then return 0 end
for i = 4, 5 do
  local t = redis.call('TYPE', KEYS[i]).ok
  if t ~= 'none' and t ~= 'zset' then return 0 end
end
redis.call('ZREM', KEYS[4], ARGV[4])
redis.call('ZADD', KEYS[5], ARGV[3], ARGV[4])
local retention = tonumber(ARGV[5])
if retention > 0 then redis.call('SET', KEYS[3], ARGV[2], 'EX', retention)
else redis.call('SET', KEYS[3], ARGV[2], 'KEEPTTL') end
return 1
