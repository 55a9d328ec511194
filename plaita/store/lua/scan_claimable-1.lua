-- Find this pass's reclaim candidates: pending entries idle at least min_idle ms, after cursor.
-- Read-only; the claim itself is claim_unleased-n.lua, which gets the candidates' lease keys in KEYS.
-- KEYS[1]  stream
-- ARGV[1]  group
-- ARGV[2]  min_idle (ms)
-- ARGV[3]  cursor: '0-0' = from the start, else the last id examined by the previous pass
-- ARGV[4]  scan limit: most pending entries examined
-- Returns  {{id, execution_id, tenant_id}, ...} in stream order; execution_id is the body's non-empty
--          string execution_id, else '' (the lease is then keyed by the message id); tenant_id is
--          the body's string tenant_id, else '' (the lease is then the default tenant's)
local start = '-'
if ARGV[3] ~= '0-0' then start = '(' .. ARGV[3] end
local pend = redis.call('XPENDING', KEYS[1], ARGV[1], 'IDLE', tonumber(ARGV[2]), start, '+', tonumber(ARGV[4]))
local out = {}
for _, p in ipairs(pend) do
  local id, exec_id, tenant = p[1], '', ''
  local entry = redis.call('XRANGE', KEYS[1], id, id)
  if #entry > 0 then
    local f = entry[1][2]
    for i = 1, #f, 2 do
      if f[i] == 'payload' then
        -- pcall: a body that is not JSON (or nested past cjson's depth limit) keeps the message id.
        local ok, body = pcall(cjson.decode, f[i + 1])
        if ok and type(body) == 'table' then
          local e = body['execution_id']
          if type(e) == 'string' and e ~= '' then exec_id = e end
          local t = body['tenant_id']
          if type(t) == 'string' then tenant = t end
        end
      end
    end
  end
  table.insert(out, {id, exec_id, tenant})
end
return out
