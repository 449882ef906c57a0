-- forget_if_idle: ARGV[12] idle ms. {1} forgotten; {0} kept (configured by an admin, not idle long
-- enough, or somebody holds a token while nobody waits: their expiries are deadlines, not the scheduler's
-- work); {2} busy (somebody waits: the caller makes sure it is in the active set); {3} does not exist. Forgets due consumed members first (bounded, as every expiry step). Reads the clock
-- without recording it: this look is not activity.
if redis.call('EXISTS', META) == 0 then return {3} end
local now = clock_now()
local last = hnum(META, 'last_ms') or now
if last > now then now = last end
if redis.call('ZCARD', WAITING) > 0 then return {2} end
if (hnum(META, 'ready') or 0) + (hnum(META, 'claimed') or 0) > 0 then return {0} end
if redis.call('HGET', META, 'managed') == '1' then return {0} end
expire_due(now)
if redis.call('HLEN', HOLDERS) > 0 or now - last < tonumber(ARGV[12]) then return {0} end
-- Retired, as delete.lua does: the queue was forgotten on purpose, not lost.
redis.call('SADD', KEYS[7], int(epoch()))
redis.call('EXPIRE', KEYS[7], 2592000)
redis.call('UNLINK', META, WAITING, HOLDERS, DEADLINES, ARRIVALS, ADMITTED)
return {1}
