-- The first write of a create or checkpoint: the ZADD of the execution to its status index,
-- which fails alone (nothing written before it) when that key is not a sorted set. Returns nil
-- when written, 'wrong' for a wrong-typed index (the caller replies which key), or any other
-- error reply as it came, for the caller to return: Redis refuses a script's first write over
-- maxmemory (OOM), and that is the server's state, not a wrong-typed key. Nothing is written
-- unless it returns nil. (Returned, not raised: an error table raised with error() reaches a
-- pcall in Redis 7.0 as its text, which a batch twin could not tell from a script's own error.)
local function index_write(key, score, member)
  local added = redis.pcall('ZADD', key, score, member)
  if type(added) ~= 'table' then return nil end
  if string.sub(added.err, 1, 9) == 'WRONGTYPE' then return 'wrong' end
  return added
end
