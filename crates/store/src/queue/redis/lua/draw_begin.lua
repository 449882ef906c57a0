-- draw_begin: ARGV[12] owner, ARGV[13] lease ms. KEYS[7] the drawn list. Step 2 of the draw
-- (crate::queue::draw): when opensAt is due, freeze the pre-queue (B = next sequence, K0 = waiting,
-- next sequence := L = B + K0) and lease the draw to the caller; a draw whose lease lapsed is granted anew
-- (a new pass, from an empty drawn list). Returns {0} not scheduled, {1} not due, {2} held elsewhere,
-- {3, seed, B, L} begun, {4} done.
local DRAWN = KEYS[7]
if redis.call('EXISTS', META) == 0 then return {0} end
local d = redis.call('HMGET', META, 'dphase', 'dopens', 'dseed', 'downer', 'dlease', 'dB', 'dL')
if not d[1] then return {0} end
if d[1] == 'F' then return {4} end
local now = guarded_now()
if d[1] == 'S' then
  if now < tonumber(d[2]) then return {1} end
  local k0 = redis.call('ZCARD', WAITING)
  local b = tonumber(redis.call('HGET', META, 'seq'))
  local l = b + k0
  redis.call('HSET', META, 'seq', int(l), 'dB', int(b), 'dL', int(l), 'dk0', int(k0), 'ddrawn', '0')
  redis.call('DEL', DRAWN)
  if k0 == 0 then
    redis.call('HSET', META, 'dphase', 'F')
    return {4}
  end
  redis.call('HSET', META, 'dphase', 'D', 'downer', ARGV[12], 'dlease', int(now + tonumber(ARGV[13])))
  return {3, d[3], int(b), int(l)}
end
if d[4] ~= ARGV[12] and tonumber(d[5] or '0') > now then return {2} end
redis.call('HSET', META, 'downer', ARGV[12], 'dlease', int(now + tonumber(ARGV[13])), 'ddrawn', '0')
redis.call('DEL', DRAWN)
return {3, d[3], d[6], d[7]}
