-- pause_group: ARGV[2] group, [3] reason. Parks the group's ready jobs; 1 paused, 0 paused already.
-- The ready set is walked whole: a job queue's ready set is its backlog (deliveries waiting), small next
-- to what a script may touch, and a pause is rare.
local now = guarded_now()
local group = ARGV[2]
if redis.call('HEXISTS', PAUSED, group) == 1 then return 0 end
redis.call('HSET', PAUSED, group, int(now) .. '|' .. ARGV[3])
for _, id in ipairs(redis.call('ZRANGE', READY, 0, -1)) do
  if group_of(id) == group then
    redis.call('ZREM', READY, id)
    redis.call('ZADD', PARKED, int(now), id)
  end
end
return 1
