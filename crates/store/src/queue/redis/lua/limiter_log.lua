-- Sliding log (rankgate_core::limiter::SlidingLog): the window is (now - window, now]; refused requests are
-- not recorded, so the log never holds more than LIMIT entries. {1, remaining, reset ms} or {0, retry after ms}.
local now = guarded_now()
redis.call('DEL', WINDOW)
redis.call('ZREMRANGEBYSCORE', LOG, '-inf', int(now - WINDOW_MS))
local n = redis.call('ZCARD', LOG)
local function oldest()
  local o = redis.call('ZRANGE', LOG, 0, 0, 'WITHSCORES')
  if o[2] then return tonumber(o[2]) end
  return now
end
if n >= LIMIT then
  return {0, math.max(oldest() + WINDOW_MS - now, 1)}
end
local id = redis.call('HINCRBY', META, 'n', 1)
redis.call('ZADD', LOG, int(now), int(now) .. ':' .. id)
n = n + 1
if n > LIMIT then
  redis.call('ZREMRANGEBYRANK', LOG, 0, n - LIMIT - 1)
  n = LIMIT
end
redis.call('PEXPIRE', LOG, int(TTL_MS))
return {1, LIMIT - n, math.max(oldest() + WINDOW_MS - now, 0)}
