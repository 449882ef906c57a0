-- Bucketed sliding-window counter (rankgate_core::limiter::SlidingWindowCounter): the oldest, partly expired
-- bucket is weighted by the part still inside the window. {1, remaining, reset ms} or {0, retry after ms}.
local now = guarded_now()
redis.call('DEL', LOG)
local bucket_ms = math.max(math.floor(WINDOW_MS / math.max(BUCKETS, 1)), 1)
local current = math.floor(now / bucket_ms) * bucket_ms
local window_start = now - WINDOW_MS
local estimate, first = 0.0, nil
local all = redis.call('HGETALL', WINDOW)
for i = 1, #all, 2 do
  local start, count = tonumber(all[i]), tonumber(all[i + 1])
  if start + bucket_ms <= window_start then
    redis.call('HDEL', WINDOW, all[i])
  else
    if start >= window_start then
      estimate = estimate + count
    else
      local inside = (start + bucket_ms - window_start) / bucket_ms
      estimate = estimate + count * math.min(math.max(inside, 0), 1)
    end
    if first == nil or start < first then first = start end
  end
end
if estimate + 1.0 > LIMIT + 1e-9 then
  local oldest_end = now + bucket_ms
  if first then oldest_end = first + bucket_ms end
  return {0, math.max(oldest_end + WINDOW_MS - now, 1)}
end
redis.call('HINCRBY', WINDOW, int(current), 1)
redis.call('PEXPIRE', WINDOW, int(TTL_MS))
local used = math.ceil(estimate + 1.0)
return {1, math.max(LIMIT - used, 0), WINDOW_MS}
