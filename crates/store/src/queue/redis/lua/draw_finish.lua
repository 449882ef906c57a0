-- draw_finish: ARGV[12] owner. KEYS[7] the drawn list, KEYS[8] the entrant list (dropped: the drawn list now
-- holds every entrant). Step 6 of the draw: done, unless a pre-queue member
-- is still scored below B (this pass missed them: run another). Returns {1, drawn}, {2} incomplete, {0} not
-- the lease holder.
local DRAWN, ENTRANTS = KEYS[7], KEYS[8]
local d = redis.call('HMGET', META, 'dphase', 'downer', 'dB')
if d[1] ~= 'D' or d[2] ~= ARGV[12] then return {0} end
guarded_now()
if redis.call('ZCOUNT', WAITING, '-inf', '(' .. d[3]) > 0 then return {2} end
local drawn = redis.call('LLEN', DRAWN)
redis.call('HSET', META, 'dphase', 'F', 'ddrawn', int(drawn))
redis.call('HDEL', META, 'downer', 'dlease')
redis.call('DEL', ENTRANTS)
return {1, drawn}
