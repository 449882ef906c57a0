-- poll (GET …/entries/{member}) for a batch of members: each one's position and per-member poll limit, all
-- in ONE script (concurrent polls of one queue share one call; see coalesce.rs). ARGV[2] is the idle slack of
-- the log keys (ms), then a pair per member: ARGV[1 + 2i] the member, ARGV[2 + 2i] the polls they are allowed
-- per window (poll_burst); KEYS[6 + i] is their poll log. The logs carry the queue's hash tag, so the script
-- stays on one slot.
--
-- The limit is rankgate_core::limiter::SlidingLog, the maths of limiter_log.lua: window (now - window, now],
-- refused polls are not recorded, the log is capped at the limit, and the key has its own monotonic guard
-- over the store clock, exactly as a RateLimiter call (the embedded service's poll) sees it: the queue's
-- guard is the position's, not the limit's.
-- The window is poll_burst polling intervals, the interval being the tier of the rank just read
-- (rankgate_core::queue::polling_tier_seconds: 1 s below rank 100, 3 s below 1000, else 5 s). The log is
-- one string, "<guard ms>|<t>|<t>…" oldest first, read with GET and written with one SET … PX: a poll
-- costs two commands for its limit instead of a second script.
-- Returns batch_head, then six fields per member: status + 4 × last outcome (as in view_of), rank, token
-- nonce, token expiry, then remaining and reset ms (allowed) or -(retry after ms) and 0 (refused: retry
-- after is at least 1). The window is not sent: the caller knows the burst and the tier of the rank. Every
-- field is one RESP value the client parses, so six instead of nine is a third less of that per poll.
-- A member whose poll raised an error (a record this version cannot read) gets status -1 and the error
-- text as the nonce; the others are answered as usual.
local e, queue_now, clock = read_meta()
local waiting = e and redis.call('ZCARD', WAITING) or 0
local slack = tonumber(ARGV[2])

local out = batch_head(queue_now, waiting, e)

local function poll_one(member, limit, log_key)
  local status, rank, nonce, expires, last = member_position(member, e, queue_now)
  local tier = 1
  if rank >= 1000 then
    tier = 5
  elseif rank >= 100 then
    tier = 3
  end
  local window = tier * limit * 1000
  local now = clock
  -- The recorded polls still inside the window, kept as the strings they were stored as.
  local kept, n, oldest = {}, 0, nil
  local raw = redis.call('GET', log_key)
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
  local allowed, a, b
  if n >= limit then
    allowed, a, b = 0, math.max(oldest + window - now, 1), 0
  else
    n = n + 1
    kept[n] = stamp
    oldest = oldest or now
    while n > limit do
      table.remove(kept, 1)
      n = n - 1
      oldest = tonumber(kept[1])
    end
    allowed, a, b = 1, limit - n, math.max(oldest + window - now, 0)
  end
  if n > 0 then stamp = stamp .. '|' .. table.concat(kept, '|') end
  redis.call('SET', log_key, stamp, 'PX', int(window * 2 + slack))
  if allowed == 0 then a, b = -a, 0 end
  local at = #out
  out[at + 1], out[at + 2], out[at + 3], out[at + 4], out[at + 5], out[at + 6] =
    status + 4 * last, rank, nonce, expires, a, b
end

for i = 1, (#ARGV - 2) / 2 do
  local ok, err = pcall(poll_one, ARGV[1 + 2 * i], tonumber(ARGV[2 + 2 * i]), KEYS[6 + i])
  if not ok then
    local at = 9 + (i - 1) * 6
    for j = #out, at + 1, -1 do out[j] = nil end
    out[at + 1], out[at + 2], out[at + 3], out[at + 4], out[at + 5], out[at + 6] = -1, -1, tostring(err), 0, 0, 0
  end
end
return out
