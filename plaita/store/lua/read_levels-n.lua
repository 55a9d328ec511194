-- The busy read of one stream's priority levels in one round trip: new entries of each level in
-- the order given, until COUNT (XREADGROUP without BLOCK may run in a script). Every key shares
-- the partition's hash tag (plaita.store.streams.levels), so the script is single-slot.
-- KEYS[i]  the stream of the i-th level to try (highest first, or the fair read's order)
-- ARGV[1]  the group
-- ARGV[2]  the consumer
-- ARGV[3]  how many entries at most
-- Returns  {i, entries, j, entries, ...}: the KEYS index of each stream read from and its entries
--          as XREADGROUP gives them ({id, {field, value, ...}} each)
local left = tonumber(ARGV[3])
local out = {}
for i = 1, #KEYS do
  if left <= 0 then break end
  local reply = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', left, 'STREAMS', KEYS[i], '>')
  if reply then
    local entries = reply[1][2]
    out[#out + 1] = i
    out[#out + 1] = entries
    left = left - #entries
  end
end
return out
