-- busy: {1} if anybody waits, else {0}. The caller's check after it took the queue out of the active set
-- (the queues admission visits): a member who entered meanwhile puts it back. READY and CLAIMED members
-- need no admission tick: their expiries are deadlines the schedulers keep (`expire.lua` answers them).
if redis.call('EXISTS', META) == 0 then return {0} end
if redis.call('ZCARD', WAITING) > 0 then return {1} end
return {0}
