-- admit: ARGV[12..] pairs of (nonce hex, token digest hex). One admission step: expire what is due, refill the
-- queue's global budget, pop what it (and max_active, and the tokens offered) allow, and make every popped
-- member READY with a token hash, all in this one script: nobody is ever popped without a token.
if redis.call('EXISTS', META) == 0 then return {{}, 0, 0, 0, 0} end
local now = guarded_now()
local tokens_expired, claims_expired = expire_due(now)
local waiting_before = redis.call('ZCARD', WAITING)
local outstanding = hnum(META, 'ready') + hnum(META, 'claimed')
local s = settings()
-- A scheduled opening admits nobody before and during its draw (the pre-queue; draw_begin.lua).
local dphase = redis.call('HGET', META, 'dphase')
if dphase == 'S' or dphase == 'D' then s.paused = true end
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
if count > 0 then
  local popped = redis.call('ZPOPMIN', WAITING, count)
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

-- The throughput estimator (rankgate_core::queue::ThroughputEstimator::record_admission_step).
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
local last_step = hnum(META, 'last_step')
if last_step then
  -- 'as': admitted by earlier steps in last_step's millisecond (a tick in several chunks).
  local pending = (hnum(META, 'as') or 0) + n
  if now > last_step then
    local elapsed = now - last_step
    if waiting_before > 0 then
      redis.call('HSET', META, 'ar', flt(fold(hnum(META, 'ar'), pending * 1000.0 / elapsed, elapsed)))
    end
    local consumed = (hnum(META, 'cs') or 0) * 1000.0 / elapsed
    redis.call('HSET', META, 'cr', flt(fold(hnum(META, 'cr'), consumed, elapsed)), 'cs', '0', 'as', '0',
      'last_step', int(now))
  else
    redis.call('HSET', META, 'as', int(pending))
  end
else
  redis.call('HSET', META, 'last_step', int(now))
end
oldest_wait_ms(now)
return {admitted, tokens_expired, claims_expired, redis.call('ZCARD', WAITING),
  hnum(META, 'ready') + hnum(META, 'claimed')}
