-- Delete entries already acked but not deleted (a process died between XACK and XDEL). Only
-- entries at or below the group's last-delivered id and absent from the pending list are touched.
-- KEYS[1]  stream
-- ARGV[1]  group
-- ARGV[2]  batch: most entries examined
-- Returns  how many were deleted
local last = nil
for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local info = {}
  for i = 1, #g, 2 do info[g[i]] = g[i + 1] end
  if info['name'] == ARGV[1] then last = info['last-delivered-id'] end
end
if not last or last == '0-0' then return 0 end
local entries = redis.call('XRANGE', KEYS[1], '-', last, 'COUNT', tonumber(ARGV[2]))
if #entries == 0 then return 0 end
local victims = {}
for _, e in ipairs(entries) do
  -- One exact lookup per entry: a range XPENDING with COUNT #entries can be filled by
  -- deleted-but-pending ids lying between the live entries and miss a live pending one.
  if #redis.call('XPENDING', KEYS[1], ARGV[1], e[1], e[1], 1) == 0 then table.insert(victims, e[1]) end
end
if #victims == 0 then return 0 end
return redis.call('XDEL', KEYS[1], unpack(victims))
