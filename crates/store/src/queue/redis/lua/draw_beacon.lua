-- draw_beacon: ARGV[12] round, ARGV[13] value (lowercase hex). Step 4 of the draw: the value of the
-- queue's drawBeaconRound, accepted once, only while the draw awaits it. Returns {1} accepted, {2} this
-- value was accepted before, {3} another value was, {4, expected round or ''} wrong round, {0} no draw
-- awaits a beacon.
local d = redis.call('HMGET', META, 'dphase', 'dround', 'dbeacon')
if not d[1] then return {0} end
if d[2] ~= ARGV[12] then return {4, d[2] or ''} end
if d[3] then
  if d[3] == ARGV[13] then return {2} end
  return {3}
end
if d[1] ~= 'B' then return {0} end
guarded_now()
redis.call('HSET', META, 'dbeacon', ARGV[13], 'dphase', 'D')
return {1}
