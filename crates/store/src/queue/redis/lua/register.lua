-- register: KEYS[1] the queue registry (set, slot {rg}); ARGV[1] queue name, ARGV[2] max_queues.
-- Lists a queue that is about to be created by its first entry, unless max_queues are listed already:
-- {1} listed (or was already), {0} refused. One script, so concurrent first entries into different
-- queues on several instances never overshoot the cap.
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 then return {1} end
if redis.call('SCARD', KEYS[1]) >= tonumber(ARGV[2]) then return {0} end
redis.call('SADD', KEYS[1], ARGV[1])
return {1}
