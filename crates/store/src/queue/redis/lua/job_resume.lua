-- resume_group: ARGV[2] group. Its parked jobs are due now with fresh attempts; 1 resumed, 0 not paused.
local now = guarded_now()
local group = ARGV[2]
if redis.call('HDEL', PAUSED, group) == 0 then return 0 end
for _, id in ipairs(redis.call('ZRANGE', PARKED, 0, -1)) do
  if group_of(id) == group then
    redis.call('ZREM', PARKED, id)
    local r = get_record(id)
    if r then
      r.attempts = 0
      r.token = ''
      put_record(id, r)
      redis.call('ZADD', READY, int(now), id)
    end
  end
end
return 1
