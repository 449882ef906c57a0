-- stats: {settings x9, waiting, ready, claimed, oldest wait ms, now, admit rate, consume rate, {second, n, ...},
-- abandoned (total), adaptive settings (JSON, '' for the defaults), epoch};
-- {} for a queue that does not exist.
if redis.call('EXISTS', META) == 0 then return {} end
local now = guarded_now()
local oldest = oldest_wait_ms(now)
local out = {}
for _, v in ipairs(settings().raw) do out[#out + 1] = v end
local e = redis.call('HMGET', META, 'ready', 'claimed', 'ar', 'cr', 'abandoned')
out[#out + 1] = redis.call('ZCARD', WAITING)
out[#out + 1] = tonumber(e[1])
out[#out + 1] = tonumber(e[2])
out[#out + 1] = oldest
out[#out + 1] = now
out[#out + 1] = e[3] or ''
out[#out + 1] = e[4] or ''
out[#out + 1] = redis.call('HGETALL', ADMITTED)
out[#out + 1] = tonumber(e[5] or '0')
out[#out + 1] = redis.call('HGET', META, 'adaptive') or ''
out[#out + 1] = epoch()
return out
