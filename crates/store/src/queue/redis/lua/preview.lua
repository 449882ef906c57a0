-- admission_preview: {settings x9, waiting, ready + claimed, adaptive settings (JSON or '')}, or {} for a queue that does not exist.
-- Read-only: sizes the tokens the next admit.lua call is offered.
if redis.call('EXISTS', META) == 0 then return {} end
local out = {}
for _, v in ipairs(settings().raw) do out[#out + 1] = v end
out[#out + 1] = redis.call('ZCARD', WAITING)
out[#out + 1] = hnum(META, 'ready') + hnum(META, 'claimed')
out[#out + 1] = redis.call('HGET', META, 'adaptive') or ''
return out
