-- Move one delayed task onto its stream now, whatever its due time (a cancelled delayed start: a
-- worker reads it at once, sees its cancel flag and ends it cancelled). Atomic like move_due: the
-- member is added and removed together, and a member already moved is not found (nothing added).
-- KEYS[1]  the delayed set (member = "<id> <schema_version> <payload>")
-- KEYS[2]  its stream
-- ARGV[1]  the member's due time (epoch ms: its score)
-- ARGV[2]  the member's id
-- ARGV[3]  the payload field name
-- ARGV[4]  the schema_version field name
-- Returns  1 moved, 0 not found (moved already), -1 a key holds the wrong type (nothing moved)
local want = {[1] = 'zset', [2] = 'stream'}
for i = 1, 2 do
  local t = redis.call('TYPE', KEYS[i]).ok
  if t ~= 'none' and t ~= want[i] then return -1 end
end
local head = ARGV[2] .. ' '
for _, member in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], ARGV[1], ARGV[1])) do
  if string.sub(member, 1, #head) == head then
    local b = string.find(member, ' ', #head + 1, true)
    if b then
      local schema, payload = string.sub(member, #head + 1, b - 1), string.sub(member, b + 1)
      redis.call('XADD', KEYS[2], '*', ARGV[3], payload, ARGV[4], schema)
      redis.call('ZREM', KEYS[1], member)
      return 1
    end
  end
end
return 0
