-- expire_due: {tokens expired, claims released, 1 if more are due (the caller calls again), members dropped
-- as abandoned, the earliest deadline left ('' for none)}.
if redis.call('EXISTS', META) == 0 then return {0, 0, 0, 0, ''} end
local now = guarded_now()
local tokens, claims, more, abandoned = expire_due(now)
return {tokens, claims, more, abandoned, next_deadline()}
