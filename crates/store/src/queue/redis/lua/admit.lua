-- admit: ARGV[12..] pairs of (nonce hex, token digest hex). One admission step: expire what is due, refill the
-- queue's global budget, pop what it (and max_active, and the tokens offered) allow, and make every popped
-- member READY with a token hash, all in this one script: nobody is ever popped without a token.
if redis.call('EXISTS', META) == 0 then return {{}, 0, 0, 0, 0, {}, 0, ''} end
local now = guarded_now()
local tokens_expired, claims_expired, _, abandoned = expire_due(now)
local waiting_before = redis.call('ZCARD', WAITING)
local outstanding = hnum(META, 'ready') + hnum(META, 'claimed')
local s = settings()
-- A scheduled opening admits nobody before and during its draw (the pre-queue; draw_begin.lua).
local dphase = redis.call('HGET', META, 'dphase')
if dphase and dphase ~= 'F' then s.paused = true end
local credit = refill(s, now)
local plan = 0
if not s.paused then
  local affordable = math.max(math.floor(credit / MICRO), 0)
  local room = affordable
  if s.max_active then room = math.max(s.max_active - outstanding, 0) end
  plan = math.min(affordable, room, waiting_before)
end
local offered = math.floor((#ARGV - 11) / 2)
local count = math.min(plan, offered)
local admitted = {}
-- Each admitted member's wait (ms; -1 when unknown), from the arrival checkpoint that covers its sequence:
-- popped members come in sequence order, so one range read of the checkpoints serves them all. Exact,
-- as checkpoints go only wholly before the head (oldest_wait_ms); the sale report counts them.
local waits = {}
if count > 0 then
  local popped = redis.call('ZPOPMIN', WAITING, count)
  local covers = {}
  -- Restored places (below zero) come first and have no checkpoint; fresh arrivals follow.
  local first_seq = nil
  for i = 2, #popped, 2 do
    local seq = tonumber(popped[i])
    if seq >= 0 then first_seq = seq break end
  end
  if first_seq and first_seq >= 0 then
    local cover = redis.call('ZREVRANGEBYSCORE', ARRIVALS, int(first_seq), '-inf', 'WITHSCORES', 'LIMIT', 0, 1)
    if cover[1] then covers[1] = {tonumber(cover[2]), tonumber(cover[1])} end
    local later = redis.call('ZRANGEBYSCORE', ARRIVALS, '(' .. int(first_seq), int(tonumber(popped[#popped])), 'WITHSCORES')
    for j = 1, #later, 2 do covers[#covers + 1] = {tonumber(later[j + 1]), tonumber(later[j])} end
  end
  local c = 0
  for i = 1, #popped, 2 do
    local seq = tonumber(popped[i + 1])
    while c < #covers and covers[c + 1][1] <= seq do c = c + 1 end
    if seq >= 0 and c > 0 then
      waits[#waits + 1] = math.max(now - covers[c][2], 0)
    else
      waits[#waits + 1] = -1
    end
  end
  for i = 1, #popped, 2 do
    local k = (i + 1) / 2
    local member = popped[i]
    set_state(member, {kind = 'N'}, {kind = 'R', nonce = ARGV[10 + 2 * k], digest = ARGV[11 + 2 * k], issued = now,
      expires = now + s.token_ttl_ms, expired_claim = ''}, now)
    admitted[#admitted + 1] = member
  end
end
credit = credit - #admitted * MICRO
redis.call('HSET', META, 'credit', int(credit))

-- The throughput estimator: rankgate_core::queue::ThroughputEstimator::record_admission_step, the same
-- arithmetic in the same order (the equivalence test compares the two backends' estimates). Meta fields:
-- last_step, mg (the last step left members waiting, unpaused), lm (the interval that ended at last_step was
-- measured), mm / mw (decayed members / ms measured), ar (their rate), wn / wc / ww (admission window,
-- its count, wholly measured), wm / wv (moving mean / variance per window), cr / cs (consumption).
local function fold(avg, sample, elapsed)
  if avg == nil then return sample end
  local alpha = 1.0 - math.exp(-elapsed / SMOOTHING_MILLIS)
  return avg + alpha * (sample - avg)
end
local n = #admitted
if n > 0 then
  local second = math.floor(now / 1000)
  redis.call('HINCRBY', ADMITTED, int(second), n)
  for _, field in ipairs(redis.call('HKEYS', ADMITTED)) do
    if tonumber(field) <= second - 60 then redis.call('HDEL', ADMITTED, field) end
  end
end
local aps = tonumber(s.raw[1])
local window_ms = math.max(s.tick, 1000)
local ev = redis.call('HMGET', META, 'last_step', 'mg', 'lm', 'mm', 'mw', 'wn', 'wc', 'ww', 'wm', 'wv', 'cr', 'cs')
local last_step = tonumber(ev[1])
local measured, elapsed = false, 0
if last_step then
  if now <= last_step then
    -- Another step in the same millisecond: part of the interval that step measured (or not).
    measured = ev[3] == '1'
  else
    elapsed = now - last_step
    measured = ev[2] == '1' and not s.paused and waiting_before > 0 and elapsed <= MAX_GAP_WINDOWS * window_ms
  end
end
local upd = {}
local function put(field, value)
  upd[#upd + 1] = field
  upd[#upd + 1] = value
end
if measured then
  local mm, mw = tonumber(ev[4]) or 0, tonumber(ev[5]) or 0
  if mw <= 0 then
    -- The prior: PRIOR_MILLIS at the configured rate.
    mw = PRIOR_MILLIS
    mm = aps * PRIOR_MILLIS / 1000.0
  end
  local decay = math.exp(-elapsed / SMOOTHING_MILLIS)
  mm = mm * decay + n
  mw = mw * decay + elapsed
  put('mm', flt(mm))
  put('mw', flt(mw))
  put('ar', flt(mm * 1000.0 / mw))
end
local window = math.floor(now / window_ms)
local wc, whole = tonumber(ev[7]) or 0, ev[8] == '1'
if not last_step or window ~= tonumber(ev[6]) then
  if last_step and whole and measured then
    local seconds = window_ms / 1000.0
    local sample = wc / math.sqrt(seconds)
    local alpha = 1.0 - math.exp(-window_ms / VARIANCE_SMOOTHING_MILLIS)
    local mean = tonumber(ev[9]) or aps * math.sqrt(seconds)
    local variance = tonumber(ev[10]) or aps
    local diff = sample - mean
    put('wm', flt(mean + alpha * diff))
    put('wv', flt((1.0 - alpha) * (variance + alpha * diff * diff)))
  end
  wc, whole = 0, measured
else
  whole = whole and measured
end
if measured then wc = wc + n end
put('wn', int(window))
put('wc', int(wc))
put('ww', whole and '1' or '0')
if last_step and now > last_step then
  local consumed = (tonumber(ev[12]) or 0) * 1000.0 / elapsed
  put('cr', flt(fold(tonumber(ev[11]), consumed, elapsed)))
  put('cs', '0')
end
if not last_step or now > last_step then
  put('last_step', int(now))
  put('lm', measured and '1' or '0')
end
put('mg', (not s.paused and waiting_before - n > 0) and '1' or '0')
redis.call('HSET', META, unpack(upd))
redis.call('HDEL', META, 'as')
oldest_wait_ms(now)
return {admitted, tokens_expired, claims_expired, redis.call('ZCARD', WAITING),
  hnum(META, 'ready') + hnum(META, 'claimed'), waits, abandoned, next_deadline()}
