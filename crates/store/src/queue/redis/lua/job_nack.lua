-- nack: ARGV[2] id, [3] claim token, [4] reason, [5] jitter unit, [6] min delay ms.
-- {1, retry at}, {2} dead, {3} parked (its group is paused), {0} stale claim.
local now = guarded_now()
local id = ARGV[2]
local r = get_record(id)
if not r or r.token ~= ARGV[3] or not redis.call('ZSCORE', PROCESSING, id) then return {0} end
local due, parked = after_failure(id, r, now, tonumber(ARGV[5]), ARGV[4], tonumber(ARGV[6]))
if due then return {1, due} end
if parked then return {3} end
return {2}
