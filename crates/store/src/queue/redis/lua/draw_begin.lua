-- draw_begin: ARGV[12] owner, ARGV[13] lease ms. KEYS[7] the drawn list, KEYS[8] the entrant list. Step 2
-- of the draw (crate::queue::draw): when opensAt is due, close the pre-queue if no entry did
-- (close_pre_queue_if_due in queue_common.lua) and lease the entrant pass to the caller; a closing or
-- drawing pass nobody holds, or whose lease lapsed, is granted anew, writing its list again from empty. Returns {0} not scheduled, {1} not due, {2}
-- held elsewhere, {3, seed, B, L, stage, entrants commitment, beacon} begun (stage 'E' entrants, 'O'
-- order), {4} done, {5} awaiting the beacon.
local DRAWN, ENTRANTS = KEYS[7], KEYS[8]
if redis.call('EXISTS', META) == 0 then return {0} end
local d = redis.call('HMGET', META, 'dphase', 'dopens', 'dseed', 'downer', 'dlease', 'dB', 'dL', 'dentc',
  'dbeacon')
if not d[1] then return {0} end
if d[1] == 'F' then return {4} end
if d[1] == 'B' then return {5} end
local now = guarded_now()
local phase = d[1]
if phase == 'S' then
  if not close_pre_queue_if_due(now) then return {1} end
  d = redis.call('HMGET', META, 'dphase', 'dopens', 'dseed', 'downer', 'dlease', 'dB', 'dL', 'dentc',
    'dbeacon')
  if d[1] == 'F' then return {4} end
  phase = 'C'
elseif d[4] and d[4] ~= ARGV[12] and tonumber(d[5] or '0') > now then
  return {2}
elseif phase == 'D' and not d[8] then
  -- A draw that began before entrant commitments existed is closed again.
  phase = 'C'
end
redis.call('HSET', META, 'dphase', phase, 'downer', ARGV[12], 'dlease', int(now + tonumber(ARGV[13])),
  'ddrawn', '0')
redis.call('DEL', DRAWN)
if phase == 'C' then
  redis.call('DEL', ENTRANTS)
  return {3, d[3], d[6], d[7], 'E', '', ''}
end
return {3, d[3], d[6], d[7], 'O', d[8], d[9] or ''}
