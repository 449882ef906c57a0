-- draw_write: ARGV[12] owner, ARGV[13] lease ms, ARGV[14] first drawn position, ARGV[15..] members in drawn
-- order. KEYS[7] the drawn list. Step 5 of the draw: drawn position i gets the sequence B + i, only for a
-- member still waiting below L (a member who left and came back is a later arrival now), and the chunk is
-- appended to the drawn list. The list's length makes a retried call a no-op. Returns {1} written, {0}
-- not the lease holder (or out of order).
local DRAWN = KEYS[7]
local d = redis.call('HMGET', META, 'dphase', 'downer', 'dB', 'dL')
if d[1] ~= 'D' or d[2] ~= ARGV[12] then return {0} end
local now = guarded_now()
local first = tonumber(ARGV[14])
local n = #ARGV - 14
local listed = redis.call('LLEN', DRAWN)
if listed == first + n then return {1} end
if listed ~= first then return {0} end
local b, l = tonumber(d[3]), tonumber(d[4])
for i = 1, n do
  local member = ARGV[14 + i]
  local score = redis.call('ZSCORE', WAITING, member)
  if score and tonumber(score) < l then
    redis.call('ZADD', WAITING, 'XX', int(b + first + i - 1), member)
  end
end
if n > 0 then redis.call('RPUSH', DRAWN, unpack(ARGV, 15)) end
redis.call('HSET', META, 'dlease', int(now + tonumber(ARGV[13])), 'ddrawn', int(listed + n))
return {1}
