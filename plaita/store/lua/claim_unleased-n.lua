-- Claim reclaim candidates whose execution lease is absent, checked and claimed atomically.
-- XCLAIM's min-idle-time re-checks idleness here, so an entry its holder renewed since the scan
-- (scan_claimable-1.lua) is left alone.
-- KEYS[1]    stream
-- KEYS[1+i]  lease key of candidate i ({ns}:execution:lease:{execution id or message id})
-- ARGV[1]    group
-- ARGV[2]    consumer claiming
-- ARGV[3]    min_idle (ms)
-- ARGV[4]    want: stop after claiming this many entries of live consumers (0: claim none)
-- ARGV[5]    scan limit the scan used (a full scan means the pending list goes on)
-- ARGV[6]    dead_ms: a consumer silent this long is dead, and its entries do not count toward
--            want (its successor holds them as crash suspects, not in handler slots); 0 = every
--            entry counts
-- ARGV[6+i]  candidate i's id (as many as lease keys)
-- Returns    {next cursor ('0-0' at the end of the pending list), {{id, fields, deliveries, idle of
--            the consumer it was taken from (ms; -1 unknown, or this consumer itself)}, ...},
--            skipped for a live lease}
local want, scan, dead_ms = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local n = #KEYS - 1
local claimed, skipped, last, live, full = {}, 0, nil, 0, false
-- How long each consumer has not talked to Redis: a dead worker's tasks are suspects
-- (plaita.runtime.suspects), a live one's failed tasks are plain redeliveries.
local idle = {}
if n > 0 then
  for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])) do
    local name, ms = nil, nil
    for j = 1, #c, 2 do
      if c[j] == 'name' then name = c[j + 1] elseif c[j] == 'idle' then ms = c[j + 1] end
    end
    if name then idle[name] = ms end
  end
end
for i = 1, n do
  local id = ARGV[6 + i]
  if redis.call('EXISTS', KEYS[1 + i]) == 1 then
    skipped = skipped + 1
  else
    local p = redis.call('XPENDING', KEYS[1], ARGV[1], id, id, 1)
    local owner_idle = -1
    if #p > 0 and p[1][2] ~= ARGV[2] and idle[p[1][2]] then owner_idle = idle[p[1][2]] end
    local counts = dead_ms <= 0 or owner_idle < dead_ms
    if counts and live >= want then
      -- want 0 (no handler slot free): a live consumer's entry ends the step before its claim.
      full = true
      break
    end
    local r = redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3]), id)
    if #r > 0 and r[1] and #p > 0 then
      table.insert(claimed, {id, r[1][2], p[1][4] + 1, owner_idle})
      if counts then live = live + 1 end
    end
  end
  last = id
  if want > 0 and live >= want then
    full = true
    break
  end
end
local nxt = '0-0'
if last and (n >= scan or full) then nxt = last end
return {nxt, claimed, skipped}
