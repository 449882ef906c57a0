-- nack: ARGV[2] id, [3] claim token, [4] reason, [5] jitter unit. {1, retry at}, {2} dead, {0} stale claim.
local now = guarded_now()
local id = ARGV[2]
local r = get_record(id)
if not r or r.token ~= ARGV[3] or not redis.call('ZSCORE', PROCESSING, id) then return {0} end
local due = after_failure(id, r, now, tonumber(ARGV[5]), ARGV[4])
if due then return {1, due} end
return {2}
