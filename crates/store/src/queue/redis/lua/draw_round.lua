-- draw_round: ARGV[12] drawBeaconRound ('' clears it). Names the beacon round a scheduled draw waits for
-- after its close; only before the close. Returns {1} set, {0} no opening, {2} closed.
local phase = redis.call('HGET', META, 'dphase')
if not phase then return {0} end
if phase ~= 'S' then return {2} end
guarded_now()
if ARGV[12] == '' then
  redis.call('HDEL', META, 'dround')
else
  redis.call('HSET', META, 'dround', ARGV[12])
end
return {1}
