-- Take back the re-arm of claim_deadlines for suspensions whose wake or timeout was not sent
-- (its enqueue failed): each is due again at once instead of after the cooldown. Only a member
-- still at the re-armed score is touched: one re-armed by a newer suspension keeps its deadline.
-- KEYS[1]  suspension deadlines (sorted set)
-- ARGV[1]  the re-armed score (epoch seconds, as claimed)
-- ARGV[2]  the score to put back (epoch seconds, due)
-- ARGV[3..] execution ids
-- Returns  how many were taken back
local rearmed, taken = tonumber(ARGV[1]), 0
for i = 3, #ARGV do
  local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if score and tonumber(score) == rearmed then
    redis.call('ZADD', KEYS[1], ARGV[2], ARGV[i])
    taken = taken + 1
  end
end
return taken
