-- enqueue: ARGV[2] id, [3] payload, [4] delay ms, [5] base delay, [6] max delay, [7] max attempts. 1 added, 0 exists.
local now = guarded_now()
local id = ARGV[2]
if redis.call('HEXISTS', RECORDS, id) == 1 then return 0 end
put_record(id, {attempts = 0, base = tonumber(ARGV[5]), max_delay = tonumber(ARGV[6]),
  max_attempts = tonumber(ARGV[7]), token = ''})
redis.call('HSET', PAYLOADS, id, ARGV[3])
if is_held(id) then
  redis.call('ZADD', PARKED, int(now), id)
else
  redis.call('ZADD', READY, int(now + math.max(tonumber(ARGV[4]), 0)), id)
end
return 1
