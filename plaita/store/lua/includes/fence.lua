-- The fence check shared by every fenced write. A writer holds the execution only while the
-- lease names its generation (the value ends in ':<generation>') and the execution's fence
-- counter, if there is one, shows no newer generation handed out. Every acquire rewrites the
-- lease value with its new generation, so a worker paused past its lease TTL cannot overwrite
-- its successor. The fence counter equals the lease's generation under lease format v1; a v2
-- acquire takes its generation from the partition's counter and leaves the fence key older or
-- absent (docs/reliability.md, "Lease format"). A missing lease, a key of another type (GET
-- fails; pcall turns that into a refusal, not a script error) or a generation that is no
-- number means fenced out.
-- The keys come in as arguments: every key a script touches stays in its own KEYS header.
local function holds_fence(lease_key, fence_key, generation)
  local cur = redis.pcall('GET', lease_key)
  local fence = redis.pcall('GET', fence_key)
  if type(cur) ~= 'string' or type(fence) == 'table' then return false end
  local want = tonumber(generation)
  if want == nil then return false end
  if fence then
    local held = tonumber(fence)
    if not (held and held <= want) then return false end
  end
  local suffix = ':' .. generation
  return string.sub(cur, -string.len(suffix)) == suffix
end
