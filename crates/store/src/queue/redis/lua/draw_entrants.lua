-- draw_entrants: ARGV[12] owner, ARGV[13] lease ms, ARGV[14] first entrant position, ARGV[15..] entrants.
-- KEYS[8] the entrant list. Step 3 of the draw: appends a chunk of the closed pre-queue to the entrant
-- list; only the lease holder of a closing pass, and the list's length makes a retried call a no-op.
-- Returns {1} written, {0} not the lease holder (or out of order).
local ENTRANTS = KEYS[8]
local d = redis.call('HMGET', META, 'dphase', 'downer')
if d[1] ~= 'C' or d[2] ~= ARGV[12] then return {0} end
local now = guarded_now()
local first = tonumber(ARGV[14])
local n = #ARGV - 14
local listed = redis.call('LLEN', ENTRANTS)
if listed == first + n then return {1} end
if listed ~= first then return {0} end
if n > 0 then redis.call('RPUSH', ENTRANTS, unpack(ARGV, 15)) end
redis.call('HSET', META, 'dlease', int(now + tonumber(ARGV[13])))
return {1}
