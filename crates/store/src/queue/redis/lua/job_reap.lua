-- reap_expired: ARGV[2..] jitter units, used in turn. Returns how many expired claims were taken back.
local now = guarded_now()
local expired = redis.call('ZRANGEBYSCORE', PROCESSING, '-inf', int(now), 'LIMIT', 0, 10000)
local units = #ARGV - 1
local count = 0
for i, id in ipairs(expired) do
  local r = get_record(id)
  if r then
    after_failure(id, r, now, tonumber(ARGV[2 + (i - 1) % units]), 'claim expired')
    count = count + 1
  else
    redis.call('ZREM', PROCESSING, id)
  end
end
return count
