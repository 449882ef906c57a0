-- draw_schedule: ARGV[12] opensAt ms ('' clears it), ARGV[13] a fresh seed (hex). KEYS[7] the drawn list,
-- KEYS[8] the entrant list. The draw's fields live in the meta hash (d*: dphase S|C|B|D|F, dopens, dseed,
-- dk0, dB, dL, ddrawn, downer, dlease, dround, dentc, dentn, dbeacon) so admit.lua sees the phase in the
-- same slot and step. A queue already scheduled keeps its seed (its published commitment stays true) and
-- its beacon round; from the close to the end of the draw the opening cannot be moved. Returns
-- {code, created}: code 0 scheduled, 1 cleared, 2 a draw is running, 3 nothing to clear.
local DRAWN, ENTRANTS = KEYS[7], KEYS[8]
local phase = redis.call('HGET', META, 'dphase')
if phase == 'C' or phase == 'B' or phase == 'D' then return {2, 0} end
if ARGV[12] == '' and not phase then return {3, 0} end
local created = ensure_queue(clock_now())
guarded_now()
redis.call('HSET', META, 'managed', '1')
if ARGV[12] == '' then
  redis.call('HDEL', META, 'dphase', 'dopens', 'dseed', 'dk0', 'dB', 'dL', 'ddrawn', 'downer', 'dlease',
    'dround', 'dentc', 'dentn', 'dbeacon')
  redis.call('DEL', DRAWN, ENTRANTS)
  return {1, created and 1 or 0}
end
local seed = ARGV[13]
if phase == 'S' then
  seed = redis.call('HGET', META, 'dseed')
else
  redis.call('DEL', DRAWN, ENTRANTS)
  redis.call('HDEL', META, 'dround', 'dentc', 'dentn', 'dbeacon')
end
redis.call('HSET', META, 'dphase', 'S', 'dopens', ARGV[12], 'dseed', seed, 'dk0', '0', 'dB', '0', 'dL', '0',
  'ddrawn', '0')
redis.call('HDEL', META, 'downer', 'dlease')
return {0, created and 1 or 0}
