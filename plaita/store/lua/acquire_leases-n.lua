-- Acquire the leases of a whole read batch, each with a new fencing generation.
-- A lease held by another holder is refused; one of this consumer's previous incarnation (a
-- restarted worker with the same stable name) is taken over; one this incarnation already holds
-- is refused too (a second task of the same execution must wait like on any other worker).
-- A lease or fence key that is not a plaita lease (another type, a fence that is no decimal
-- integer, a v1 value without TTL) is refused with a reply starting with '!': one bad key blocks
-- only its own execution, never the batch.
-- ARGV[5] picks the format written (includes/fence.lua); either format found is honoured, and
-- the new generation is one more than both the fence counter and a v2 value's, so it never goes
-- back when a fleet switches formats. Format 1 writes two keys (SET fence EX, SET lease PX),
-- format 2 one (SET lease PX of 7 days + the lease TTL): creating a key is most of the cost.
-- Every call inside a script is a command redis-server runs: one MGET reads every key of the
-- batch (a key of another type reads as nil, like an absent one), then the SETs. A key MGET read
-- as nil is written with NX, which leaves a key of another type alone and so tells the two apart
-- (see take). TYPE and PTTL run only on the way to a refusal, TIME only when a v2 value is met
-- or written.
-- KEYS[2i-1]  lease key of execution i
-- KEYS[2i]    fence counter of execution i
-- ARGV[1]     holder (worker:{consumer}@{incarnation})
-- ARGV[2]     lease ttl (ms)
-- ARGV[3]     fence counter ttl (s)
-- ARGV[4]     takeover prefix (worker:{consumer}@)
-- ARGV[5]     format written: '1' or '2' (absent: 1)
-- Returns     flat {1, generation | 0, current holder:generation or '!why', ...}, one pair per execution
--- @include "fence"
local out = {}
local lease_ttl, fence_ttl = tonumber(ARGV[2]), tonumber(ARGV[3])
local holder, takeover = ARGV[1], ARGV[4]
local own = holder .. ':'
local takeover_len, own_len = string.len(takeover), string.len(own)
local v2 = ARGV[5] == '2'
-- MGET in slices: unpack of thousands of keys would overflow Lua's C stack.
local vals = {}
for first = 1, #KEYS, 1000 do
  local got = redis.call('MGET', unpack(KEYS, first, math.min(first + 999, #KEYS)))
  for j = 1, #got do vals[first + j - 1] = got[j] end
end
-- Lease keys this call wrote: a second task of the same execution in the batch sees our value.
local written = {}

local function refuse(why)
  out[#out + 1] = 0
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

-- Whether a holder blocks us: anyone but an earlier incarnation of this consumer (us included).
local function blocks(who)
  return string.sub(who, 1, takeover_len) ~= takeover or string.sub(who, 1, own_len) == own
end

-- Why execution i's lease is refused, or nil to take it ('cur' and 'fence' as MGET read them;
-- g2, expiry, who: the v2 fields of cur, if it is one).
local function refusal(lease_key, fence_key, cur, fence, g2, expiry, who)
  local why = nil
  if fence and not (string.find(fence, '^%d+$') and string.len(fence) <= 15) then
    why = '!fence is not an integer'  -- at most 15 digits: the next generation is exact in a double
  elseif g2 then
    if tonumber(expiry) > now_ms() and blocks(who .. ':') then why = who .. ':' .. g2 end
  elseif cur and redis.call('PTTL', lease_key) == -1 then
    why = '!no ttl: ' .. string.sub(cur, 1, 100)
  elseif cur and blocks(cur) then
    why = cur
  end
  if why and not (cur and fence) then
    why = wrongtype(lease_key, fence_key) or why  -- a key of another type is reported first
  end
  return why
end

-- Take execution i's lease at generation gen: false (nothing left written) if a key holds
-- another type. The key MGET could not vouch for is written first, so a failing first write
-- leaves nothing behind; a failing second one means both were unknown, and the first, which
-- its NX found absent, is deleted again.
local function take(lease_key, fence_key, cur, fence, gen)
  local text = string.format('%d', gen)
  local lease_known, fence_known = type(cur) == 'string', type(fence) == 'string'
  if v2 then
    local value = 'v2|' .. text .. '|' .. string.format('%d', now_ms() + lease_ttl) .. '|' .. holder
    if not put(lease_key, value, lease_known, 'PX', fence_ttl * 1000 + lease_ttl) then return false end
  elseif fence_known and not lease_known then
    if not put(lease_key, own .. text, false, 'PX', lease_ttl) then return false end
    put(fence_key, text, true, 'EX', fence_ttl)
  else
    if not put(fence_key, text, fence_known, 'EX', fence_ttl) then return false end
    if not put(lease_key, own .. text, lease_known, 'PX', lease_ttl) then
      redis.call('DEL', fence_key)
      return false
    end
  end
  written[lease_key] = own .. text
  return true
end

for i = 1, #KEYS, 2 do
  local lease_key, fence_key, cur, fence = KEYS[i], KEYS[i + 1], vals[i], vals[i + 1]
  local g2, expiry, who = nil, nil, nil
  if cur then g2, expiry, who = lease_v2(cur) end
  local why = written[lease_key] or refusal(lease_key, fence_key, cur, fence, g2, expiry, who)
  local gen = math.max(tonumber(fence) or 0, tonumber(g2) or 0) + 1
  if why then
    refuse(why)  -- written: a second task of an execution this call leased, refused like ours
  elseif take(lease_key, fence_key, cur, fence, gen) then
    out[#out + 1] = 1
    out[#out + 1] = gen
  else
    refuse(wrongtype(lease_key, fence_key) or '!wrongtype')
  end
end
return out
