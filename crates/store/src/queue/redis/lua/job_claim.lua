-- claim_due: ARGV[2] limit, [3] lease ms, [4] 24 random hex digits; claim i gets token <those digits><i as 8 hex>.
-- Returns {id, payload, attempt, token, expires, ...}, oldest due first.
local now = guarded_now()
local lease = tonumber(ARGV[3])
local due = redis.call('ZRANGEBYSCORE', READY, '-inf', int(now), 'LIMIT', 0, tonumber(ARGV[2]))
local out = {}
for i, id in ipairs(due) do
  redis.call('ZREM', READY, id)
  local r = get_record(id)
  if r then
    r.attempts = r.attempts + 1
    r.token = ARGV[4] .. string.format('%08x', i)
    put_record(id, r)
    redis.call('ZADD', PROCESSING, int(now + lease), id)
    out[#out + 1] = id
    out[#out + 1] = redis.call('HGET', PAYLOADS, id) or ''
    out[#out + 1] = r.attempts
    out[#out + 1] = r.token
    out[#out + 1] = now + lease
  end
end
return out
