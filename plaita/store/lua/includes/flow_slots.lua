-- Shared by the flow-slot scripts: the server's clock, expired slots, and handing free slots to
-- parked starts (starts of a flow with max_concurrent that found no slot, kept in order of their
-- start in a sorted set, their task bodies in a hash, until a slot is free for them).
-- A slot reserved for a parked start is a normal slot entry whose owner is PROMOTED: the start's
-- task has been (or is about to be) put back on its stream, and its acquire takes the slot over.
-- The start stays in the parked set until its task takes the slot, so a reservation whose task
-- never came (the promoting worker died before its XADD) expires like any slot, and the start is
-- promoted again: a parked start is never lost (and a second copy of it is a duplicate start,
-- idempotent on its execution id). The keys come in as arguments.
local PROMOTED = '~promoted'

-- The index of the first of `keys` whose type is not its `kinds` entry (a missing key is any
-- type: it is created), or nil when every one is of its kind. Checked before any write, so a
-- key of another type (an operator's stray key) fails the call without half of its writes.
local function wrong_type(keys, kinds)
  for i = 1, #kinds do
    local kind = redis.call('TYPE', keys[i]).ok
    if kind ~= kinds[i] and kind ~= 'none' then return i end
  end
  return nil
end

local function server_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The limit in force: the flow's run-time limits record (``plaita limits set``) overrides the
-- declared `limit` of a scope that has one (> 0): `max_concurrent` for the flow's own slots,
-- `max_concurrent_per_key` for a concurrency key's (`scope` ~= '').
local function override_limit(limits, limit, scope)
  if limit <= 0 then return limit end
  local field = 'max_concurrent'
  if scope ~= '' then field = 'max_concurrent_per_key' end
  local set = tonumber(redis.call('HGET', limits, field))
  if set and set >= 1 then return set end
  return limit
end

local function prune_slots(slots, owners, now_ms)
  local expired = redis.call('ZRANGEBYSCORE', slots, '-inf', now_ms)
  for _, member in ipairs(expired) do
    redis.call('ZREM', slots, member)
    redis.call('HDEL', owners, member)
  end
end

-- Reserve the free slots for the oldest parked starts that hold none, in order, stopping at `me`
-- (a parked start asking for itself; '' = none). Returns the task bodies to put back on their
-- streams, and whether a free slot is left for `me` (reached, or not parked and slots left).
-- Each pass reads at most limit + free + 1 parked entries: at most `limit` of them hold a slot.
local function promote_parked(slots, owners, parked, tasks, limit, ttl_ms, now_ms, me)
  local bodies = {}
  local free = limit - redis.call('ZCARD', slots)
  local offset = 0
  while free > 0 do
    local batch = redis.call('ZRANGE', parked, offset, offset + limit + free)
    if #batch == 0 then break end
    for _, member in ipairs(batch) do
      if member == me then return bodies, true end
      local body = redis.call('HGET', tasks, member)
      if body and not redis.call('ZSCORE', slots, member) then
        redis.call('ZADD', slots, now_ms + ttl_ms, member)
        redis.call('HSET', owners, member, PROMOTED)
        bodies[#bodies + 1] = body
        free = free - 1
        if free == 0 then return bodies, false end
      end
    end
    offset = offset + #batch
  end
  return bodies, free > 0
end

-- The slot keys outlive every member (each expires within ttl of its last renewal), and an
-- abandoned flow's keys go away on their own. Parked starts never expire.
local function keep_slot_keys(slots, owners, ttl_ms)
  for _, key in ipairs({slots, owners}) do
    if redis.call('PTTL', key) < ttl_ms + 60000 then
      redis.call('PEXPIRE', key, ttl_ms + 60000)
    end
  end
end
