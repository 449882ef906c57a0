-- draw_seal: ARGV[12] owner, ARGV[13] lease ms, ARGV[14] entrantsCommitment (hex, computed in Rust over
-- the list as written). KEYS[8] the entrant list. End of step 3: publishes the commitment; the draw then
-- waits for the beacon (no lease: whoever ticks after it draws) or goes on under the same lease.
-- Returns {1} awaiting the beacon, {2} ready to draw, {0} not the lease holder.
local ENTRANTS = KEYS[8]
local d = redis.call('HMGET', META, 'dphase', 'downer', 'dround')
if d[1] ~= 'C' or d[2] ~= ARGV[12] then return {0} end
local now = guarded_now()
redis.call('HSET', META, 'dentc', ARGV[14], 'dentn', int(redis.call('LLEN', ENTRANTS)))
if d[3] then
  redis.call('HSET', META, 'dphase', 'B')
  redis.call('HDEL', META, 'downer', 'dlease')
  return {1}
end
redis.call('HSET', META, 'dphase', 'D', 'dlease', int(now + tonumber(ARGV[13])))
return {2}
