-- expire_due: {tokens expired, claims released}.
if redis.call('EXISTS', META) == 0 then return {0, 0} end
local now = guarded_now()
local tokens, claims = expire_due(now)
return {tokens, claims}
