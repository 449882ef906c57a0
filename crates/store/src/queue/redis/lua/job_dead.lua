-- dead_jobs: ARGV[2] limit. {id, payload, died at, reason, ...}, oldest first.
local limit = tonumber(ARGV[2])
if limit <= 0 then return {} end
local dead = redis.call('ZRANGE', DEAD, 0, limit - 1, 'WITHSCORES')
local out = {}
for i = 1, #dead, 2 do
  local id = dead[i]
  out[#out + 1] = id
  out[#out + 1] = redis.call('HGET', PAYLOADS, id) or ''
  out[#out + 1] = tonumber(dead[i + 1])
  out[#out + 1] = redis.call('HGET', REASONS, id) or ''
end
return out
