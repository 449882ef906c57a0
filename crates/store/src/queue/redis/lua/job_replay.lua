-- replay_dead: ARGV[2] id. Back to ready, due now, with fresh attempts. 1 done, 0 not dead.
local now = guarded_now()
local id = ARGV[2]
local r = get_record(id)
if not r or not redis.call('ZSCORE', DEAD, id) then return 0 end
r.attempts = 0
r.token = ''
put_record(id, r)
redis.call('ZREM', DEAD, id)
redis.call('HDEL', REASONS, id)
if is_held(id) then
  redis.call('ZADD', PARKED, int(now), id)
else
  redis.call('ZADD', READY, int(now), id)
end
return 1
