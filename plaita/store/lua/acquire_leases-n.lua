-- Acquire the leases of a whole read batch, each with a new fencing generation.
-- A lease held by another holder is refused; one of this consumer's previous incarnation (a
-- restarted worker with the same stable name) is taken over; one this incarnation already holds
-- is refused too (a second task of the same execution must wait like on any other worker).
-- A lease or fence key that is not a plaita lease (another type, a fence that is no decimal
-- integer, a value without TTL) is refused with a reply starting with '!': one bad key blocks
-- only its own execution, never the batch.
-- Two formats (ARGV[5]; docs/reliability.md, "Lease format"), the lease value the same in both:
--   v1  the generation comes from the execution's fence counter, written with it (SET fence EX
--       7 days): two keys created per execution.
--   v2  the generation comes from the partition's counter (the last KEYS, no TTL, written once
--       per call): only the lease key is created. Creating a key with a TTL is most of an
--       acquire's cost, and the released lease leaves no key behind.
-- Either way the new generation is above the execution's fence counter and the partition's
-- counter, so it never goes back when a fleet switches formats.
-- Every call inside a script is a command redis-server runs: one MGET reads every key of the
-- batch (a key of another type reads as nil, like an absent one), then the SETs. A key MGET read
-- as nil is written with NX, which leaves a key of another type alone and so tells the two apart
-- (see take). TYPE and PTTL run only on the way to a refusal. The fence is read once and written
-- as one SET EX: the same as INCR + EXPIRE, since a script runs atomically.
-- KEYS[2i-1]  lease key of execution i
-- KEYS[2i]    fence counter of execution i
-- KEYS[#KEYS] the partition's generation counter (present when #KEYS is odd)
-- ARGV[1]     holder (worker:{consumer}@{incarnation})
-- ARGV[2]     lease ttl (ms)
-- ARGV[3]     fence counter ttl (s)
-- ARGV[4]     takeover prefix (worker:{consumer}@)
-- ARGV[5]     format written: '1' or '2' (absent: 1)
-- Returns     {generation (an integer) | current value or '!why' (a string), ...}, one per execution
local out = {}
local lease_ttl, fence_ttl = tonumber(ARGV[2]), tonumber(ARGV[3])
local takeover, own = ARGV[4], ARGV[1] .. ':'
local takeover_len, own_len = string.len(takeover), string.len(own)
local pairs_end = #KEYS - (#KEYS % 2)
local counter_key = (#KEYS % 2 == 1) and KEYS[#KEYS] or nil
local v2 = ARGV[5] == '2' and counter_key ~= nil  -- without its counter v2 could not stay monotonic
-- The partition's counter: the highest generation a v2 acquire handed out ('!why' if unusable).
local last, counter_bad = 0, nil
if counter_key then
  local c = redis.pcall('GET', counter_key)
  if type(c) == 'table' then
    counter_bad = '!wrongtype generation counter ' .. counter_key .. '=' .. redis.call('TYPE', counter_key).ok
  elseif c then
    if string.find(c, '^%d+$') and string.len(c) <= 15 then last = tonumber(c)
    else counter_bad = '!generation counter ' .. counter_key .. ' is not an integer' end
  end
end
-- MGET in slices: unpack of thousands of keys would overflow Lua's C stack.
local vals = {}
for first = 1, pairs_end, 1000 do
  local got = redis.call('MGET', unpack(KEYS, first, math.min(first + 999, pairs_end)))
  for j = 1, #got do vals[first + j - 1] = got[j] end
end
-- Lease keys this call wrote: a second task of the same execution in the batch sees our value.
local written = {}

local function refuse(why)
  out[#out + 1] = why
end

-- The '!wrongtype' reason when either key holds another type, else nil.
local function wrongtype(lease_key, fence_key)
  local lt, ft = redis.call('TYPE', lease_key).ok, redis.call('TYPE', fence_key).ok
  if (lt ~= 'string' and lt ~= 'none') or (ft ~= 'string' and ft ~= 'none') then
    return '!wrongtype lease=' .. lt .. ' fence=' .. ft
  end
  return nil
end

-- SET one key; NX unless MGET read it as a string (then it is one, and is overwritten).
local function put(key, value, known, unit, ttl)
  if known then return redis.call('SET', key, value, unit, ttl) end
  return redis.call('SET', key, value, 'NX', unit, ttl)
end

-- Why execution i's lease is refused, or nil to take it ('cur' and 'fence' as MGET read them).
local function refusal(lease_key, fence_key, cur, fence)
  local why = nil
  if fence and not (string.find(fence, '^%d+$') and string.len(fence) <= 15) then
    why = '!fence is not an integer'  -- at most 15 digits: the next generation is exact in a double
  elseif cur and redis.call('PTTL', lease_key) == -1 then
    why = '!no ttl: ' .. string.sub(cur, 1, 100)
  elseif cur and (string.sub(cur, 1, takeover_len) ~= takeover or string.sub(cur, 1, own_len) == own) then
    why = cur
  end
  if why and not (cur and fence) then
    why = wrongtype(lease_key, fence_key) or why  -- a key of another type is reported first
  end
  return why or (v2 and counter_bad) or nil
end

-- Take execution i's lease at generation gen: false (nothing left written) if a key holds
-- another type. The key MGET could not vouch for is written first, so a failing first write
-- leaves nothing behind; a failing second one means both were unknown, and the first, which
-- its NX found absent, is deleted again. v2 writes the lease key alone.
local function take(lease_key, fence_key, cur, fence, gen)
  local text = string.format('%d', gen)
  local value = own .. text
  local lease_known, fence_known = type(cur) == 'string', type(fence) == 'string'
  if v2 then
    if not put(lease_key, value, lease_known, 'PX', lease_ttl) then return false end
  elseif fence_known and not lease_known then
    if not put(lease_key, value, false, 'PX', lease_ttl) then return false end
    put(fence_key, text, true, 'EX', fence_ttl)
  else
    if not put(fence_key, text, fence_known, 'EX', fence_ttl) then return false end
    if not put(lease_key, value, lease_known, 'PX', lease_ttl) then
      redis.call('DEL', fence_key)
      return false
    end
  end
  written[lease_key] = value
  return true
end

-- The generation a lease value names (0 for none): a takeover stays above it even if the fence
-- key was lost (v2 reads the fence only as a floor: one of another type reads as absent).
local function named(cur)
  local digits = cur and string.match(cur, ':(%d+)$')
  if digits and string.len(digits) <= 15 then return tonumber(digits) end
  return 0
end

local top = last
for i = 1, pairs_end, 2 do
  local lease_key, fence_key, cur, fence = KEYS[i], KEYS[i + 1], vals[i], vals[i + 1]
  local why = written[lease_key] or refusal(lease_key, fence_key, cur, fence)
  -- v2 hands out one counter value per execution; v1 only stays above the counter
  local gen = math.max(tonumber(fence) or 0, v2 and top or last, named(cur)) + 1
  if why then
    refuse(why)  -- written: a second task of an execution this call leased, refused like ours
  elseif take(lease_key, fence_key, cur, fence, gen) then
    out[#out + 1] = gen
    if gen > top then top = gen end
  else
    refuse(wrongtype(lease_key, fence_key) or '!wrongtype')
  end
end
if v2 and top > last then redis.call('SET', counter_key, string.format('%d', top)) end
return out
