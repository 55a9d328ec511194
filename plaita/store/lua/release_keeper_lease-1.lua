-- Hand the keeper role over: delete the keeper lease only if this holder still has it.
-- KEYS[1]  keeper lease
-- ARGV[1]  holder
-- Returns  1 released, 0 not ours
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
