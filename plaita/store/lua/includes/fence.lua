-- The lease formats and the fence check shared by every script that reads a lease
-- (docs/reliability.md, "Lease format"). Two formats live in the same lease key:
--   v1  '<holder>:<generation>' with a PX TTL of the lease (gone = free); the fence key holds the
--       last generation handed out (EX 7 days), since the lease key's disappears with it.
--   v2  'v2|<generation>|<expiry, server ms>|<holder>' with a PX TTL of 7 days plus the lease's:
--       one key keeps the generation after the lease ends; free once its expiry passed (a release
--       writes expiry 0). No fence key is written.
-- Every reader understands both, so workers writing either can share a queue; TIME is called
-- only when a v2 value is met (a v1-only fleet needs no +time in its ACL).
-- The keys come in as arguments: every key a script touches stays in its own KEYS header.
local now_cache = nil
local function now_ms()
  if not now_cache then
    local t = redis.call('TIME')
    now_cache = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return now_cache
end

-- generation, expiry (ms) and holder of a v2 value, as strings; nil for anything else.
local function lease_v2(value)
  return string.match(value, '^v2|(%d+)|(%d+)|(.*)$')
end

-- Whether a lease key blocks a reclaim: a v1 key or a key of another type exists (as EXISTS
-- answered before v2), a v2 value only until its expiry.
local function lease_live(lease_key)
  local cur = redis.pcall('GET', lease_key)
  if type(cur) == 'table' then return true end
  if type(cur) ~= 'string' then return false end
  local _, expiry = lease_v2(cur)
  return expiry == nil or tonumber(expiry) > now_ms()
end

-- A writer holds the execution only while the lease names its generation and no newer one was
-- handed out: v1, the value ends in ':<generation>' and the fence counter equals it; v2, the
-- value's generation is it and its expiry has not passed (a newer acquire rewrites the value).
-- So a worker paused past its lease TTL cannot overwrite its successor. A missing key, a key of
-- another type (GET fails; pcall turns that into a refusal, not a script error) or a generation
-- that is no number means fenced out.
local function holds_fence(lease_key, fence_key, generation)
  local cur = redis.pcall('GET', lease_key)
  if type(cur) ~= 'string' then return false end
  local want = tonumber(generation)
  if want == nil then return false end
  local gen, expiry = lease_v2(cur)
  if gen then return tonumber(gen) == want and tonumber(expiry) > now_ms() end
  local fence = redis.pcall('GET', fence_key)
  if type(fence) ~= 'string' or tonumber(fence) ~= want then return false end
  local suffix = ':' .. generation
  return string.sub(cur, -string.len(suffix)) == suffix
end
