-- A step's checkpoint after which the execution is still running, written by the task that put
-- it in the running index itself (its create, or its previous checkpoint): fenced like
-- checkpoint_execution, whose reply it shares, with nothing to move between indexes. Every
-- index writer keeps an execution in one status index at most, and while this task holds the
-- lease no other writer moves it (the keeper takes only unleased executions; a producer's
-- cancel of a running one sets its flag), so the running index is all there is to touch: a
-- quarter of the full script's commands and half its keys. No deadline, no staged writes, not
-- terminal: those go through checkpoint_execution.
-- KEYS[1]  lease key
-- KEYS[2]  fence counter
-- KEYS[3]  execution state
-- KEYS[4]  cancel flag
-- KEYS[5]  running index (sorted set)
-- ARGV[1]  the writer's generation
-- ARGV[2]  state JSON
-- ARGV[3]  now (whole epoch seconds; the index score)
-- ARGV[4]  execution id (the index member)
-- Returns  {1, cancel_requested} written; {0, 0} refused (fenced out, also when the lease or
--          fence key is not a string); {3, key, why} the running index is not a sorted set.
--          Nothing is written unless the reply is {1, ...}.
--- @include "fence"
--- @include "index_write"
if not holds_fence(KEYS[1], KEYS[2], ARGV[1]) then return {0, 0} end
local refused = index_write(KEYS[5], ARGV[3], ARGV[4])
if refused == 'wrong' then
  return {3, KEYS[5], 'holds a ' .. redis.call('TYPE', KEYS[5]).ok .. ', not a sorted set'}
elseif refused then
  return refused
end
redis.call('SET', KEYS[3], ARGV[2])
return {1, redis.call('EXISTS', KEYS[4])}
