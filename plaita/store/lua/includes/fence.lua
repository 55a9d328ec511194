-- The fence check shared by every fenced write. A writer holds the execution only while the
-- lease names its generation (the value ends in ':<generation>') and the fence counter equals
-- that generation (no newer one was handed out), so a worker paused past its lease TTL cannot
-- overwrite its successor. A missing key, a key of another type (GET fails; pcall turns that
-- into a refusal, not a script error) or a generation that is no number means fenced out.
-- The keys come in as arguments: every key a script touches stays in its own KEYS header.
local function holds_fence(lease_key, fence_key, generation)
  local cur = redis.pcall('GET', lease_key)
  local fence = redis.pcall('GET', fence_key)
  if type(cur) ~= 'string' or type(fence) ~= 'string' then return false end
  local want = tonumber(generation)
  if want == nil or tonumber(fence) ~= want then return false end
  local suffix = ':' .. generation
  return string.sub(cur, -string.len(suffix)) == suffix
end
