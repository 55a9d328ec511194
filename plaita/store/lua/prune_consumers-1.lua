-- Remove consumers with nothing pending that were idle longer than a threshold (never the caller),
-- atomically: a consumer cannot read between the check and the DELCONSUMER.
-- KEYS[1]  stream
-- ARGV[1]  group
-- ARGV[2]  the calling consumer (never removed)
-- ARGV[3]  idle threshold (ms)
-- Returns  the names removed
local removed = {}
for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])) do
  local info = {}
  for i = 1, #c, 2 do info[c[i]] = c[i + 1] end
  if info['name'] ~= ARGV[2] and tonumber(info['pending']) == 0 and tonumber(info['idle']) > tonumber(ARGV[3]) then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], info['name'])
    table.insert(removed, info['name'])
  end
end
return removed
