-- poll (GET …/entries/{member}): the position and the per-member poll limit in ONE script. ARGV[2] member,
-- [3] polls allowed per window (poll_burst), [4] idle slack of the log key (ms). KEYS[7] is the member's
-- poll log; it carries the queue's hash tag, so the script stays on one slot.
--
-- The limit is rankgate_core::limiter::SlidingLog, the maths of limiter_log.lua: window (now - window, now],
-- refused polls are not recorded, the log is capped at the limit, and the key has its own monotonic guard.
-- The window is poll_burst polling intervals, the interval being the tier of the rank just read
-- (rankgate_core::queue::polling_tier_seconds: 1 s below rank 100, 3 s below 1000, else 5 s). The log is
-- one string, "<guard ms>|<t>|<t>…" oldest first, read with GET and written with one SET … PX: a poll
-- costs two commands for its limit instead of a second script.
-- Returns {view, window ms, 1, remaining, reset ms} or {view, window ms, 0, retry after ms}.
local v = read_position(ARGV[2])
local limit = tonumber(ARGV[3])
local tier = 1
if v[2] >= 1000 then
  tier = 5
elseif v[2] >= 100 then
  tier = 3
end
local window = tier * limit * 1000
local now = v[7]
-- The recorded polls still inside the window, kept as the strings they were stored as.
local kept, n, oldest = {}, 0, nil
local raw = redis.call('GET', KEYS[7])
if raw then
  local f = split(raw)
  local guard = tonumber(f[1])
  if guard > now then now = guard end
  for i = 2, #f do
    local t = tonumber(f[i])
    if t > now - window then
      n = n + 1
      kept[n] = f[i]
      oldest = oldest or t
    end
  end
end
local stamp = int(now)
local out
if n >= limit then
  out = {v, window, 0, math.max(oldest + window - now, 1)}
else
  n = n + 1
  kept[n] = stamp
  oldest = oldest or now
  while n > limit do
    table.remove(kept, 1)
    n = n - 1
    oldest = tonumber(kept[1])
  end
  out = {v, window, 1, limit - n, math.max(oldest + window - now, 0)}
end
if n > 0 then stamp = stamp .. '|' .. table.concat(kept, '|') end
redis.call('SET', KEYS[7], stamp, 'PX', int(window * 2 + tonumber(ARGV[4])))
return out
