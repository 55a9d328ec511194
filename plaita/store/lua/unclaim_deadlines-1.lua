-- Move deadlines claim_deadlines claimed (re-armed to the claim's score) to another score: due
-- at once for those whose wake or timeout was not sent (its enqueue failed), after the cooldown
-- for those sent. Only a member still at the claim's score is touched: one re-armed by a newer
-- suspension keeps its deadline.
-- KEYS[1]  suspension deadlines (sorted set)
-- ARGV[1]  the re-armed score (epoch seconds, as claimed)
-- ARGV[2]  the new score (epoch seconds)
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
