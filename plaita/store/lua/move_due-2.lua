-- Move the delayed tasks that are due onto their stream, in one atomic step: each due member is
-- added to the stream and removed from the set together, so two workers moving at once (or one
-- killed mid-pass) add every task exactly once. Every worker runs it from its reclaim pass; no
-- single process is needed. The set and the stream share the partition's hash tag.
-- KEYS[1]  the delayed set (sorted set: score = due time in ms, member = "<id> <schema_version> <payload>")
-- KEYS[2]  its stream
-- ARGV[1]  now (epoch ms, on the caller's clock)
-- ARGV[2]  most members to move
-- ARGV[3]  the payload field name
-- ARGV[4]  the schema_version field name
-- Returns  how many were moved, oldest due first; -1 when a key holds the wrong type (nothing moved)
local want = {[1] = 'zset', [2] = 'stream'}
for i = 1, 2 do
  local t = redis.call('TYPE', KEYS[i]).ok
  if t ~= 'none' and t ~= want[i] then return -1 end
end
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, member in ipairs(due) do
  local a = string.find(member, ' ', 1, true)
  local b = a and string.find(member, ' ', a + 1, true)
  local schema, payload = '1', member
  -- A member plaita did not write goes on as its payload: the worker dead-letters it, visibly.
  if b then schema, payload = string.sub(member, a + 1, b - 1), string.sub(member, b + 1) end
  redis.call('XADD', KEYS[2], '*', ARGV[3], payload, ARGV[4], schema)
  redis.call('ZREM', KEYS[1], member)
end
return #due
