-- Move one pending entry to the DLQ: add the envelope first, ack and delete the source only then.
-- If the XADD fails (the DLQ key holds another type, OOM) the script stops there and the source
-- stays pending: a dead letter is never lost. An entry no longer pending was settled already (a
-- batch retried after a partial failure: partitions commit one by one): nothing is added twice.
-- KEYS[1]  dlq stream
-- KEYS[2]  source stream
-- ARGV[1]  group
-- ARGV[2]  DLQ max length (exact XTRIM)
-- ARGV[3]  source entry id
-- ARGV[4]  envelope JSON
-- Returns  1 when moved, 0 when the entry was not pending
if #redis.call('XPENDING', KEYS[2], ARGV[1], ARGV[3], ARGV[3], 1) == 0 then
  return 0
end
redis.call('XADD', KEYS[1], '*', 'payload', ARGV[4])
redis.call('XTRIM', KEYS[1], 'MAXLEN', tonumber(ARGV[2]))
redis.call('XACK', KEYS[2], ARGV[1], ARGV[3])
redis.call('XDEL', KEYS[2], ARGV[3])
return 1
