-- Prelude of the waiting-room scripts that write (prepended after queue_base.lua).
-- ARGV: 1 injected now ms, 2 consumed memory ms, 3..11 default settings; script args from 12.
local MICRO = 1000000
-- Deadlines one script handles at most; callers loop while a script reports more due (bounded work per call).
local MAX_EXPIRIES = 1000
-- rankgate_core::queue::estimate's constants.
local SMOOTHING_MILLIS = 10000.0
local PRIOR_MILLIS = 2000.0
local MAX_GAP_WINDOWS = 3
local VARIANCE_SMOOTHING_MILLIS = 30000.0
local CONSUMED_MEMORY_MS = tonumber(ARGV[2])
local SETTING_FIELDS = {'aps', 'rate_milli', 'tick', 'token_ttl', 'claim_ttl', 'max_active', 'paused', 'fail_mode',
  'abandon'}

local function flt(x) return string.format('%.17g', x) end

-- Constant-time comparison of two hex digests.
local function ct_eq(a, b)
  if #a ~= #b or #a == 0 then return false end
  local diff = 0
  for i = 1, #a do
    diff = bit.bor(diff, bit.bxor(string.byte(a, i), string.byte(b, i)))
  end
  return diff == 0
end

local function hnum(key, field)
  local v = redis.call('HGET', key, field)
  if v then return tonumber(v) end
  return nil
end

local function state_of(member)
  local seq = redis.call('ZSCORE', WAITING, member)
  if seq then return {kind = 'W', seq = tonumber(seq)} end
  return holder_state(member)
end

-- The store clock through the queue's monotonic guard: never earlier than the last time this queue used.
local function guarded_now()
  local now = clock_now()
  local last = hnum(META, 'last_ms')
  if last and last > now then now = last end
  redis.call('HSET', META, 'last_ms', int(now))
  return now
end

local function settings()
  local v = redis.call('HMGET', META, unpack(SETTING_FIELDS))
  local s = {raw = v}
  s.rate_milli = tonumber(v[2])
  s.tick = tonumber(v[3])
  s.token_ttl_ms = tonumber(v[4]) * 1000
  s.claim_ttl_ms = tonumber(v[5]) * 1000
  if v[6] and v[6] ~= '' then s.max_active = tonumber(v[6]) end
  s.paused = v[7] == '1'
  if not v[9] then
    -- A queue stored before abandonAfterSeconds existed: the default, written so the hot scripts (which get
    -- no defaults) can read it too.
    v[9] = ARGV[11]
    redis.call('HSET', META, 'abandon', v[9])
  end
  return s
end

local function capacity(s) return math.max(s.tick * s.rate_milli, MICRO) end

-- Creates the queue with the default settings and a full budget; true if it did.
local function ensure_queue(now)
  if redis.call('EXISTS', META) == 1 then return false end
  local args = {}
  for i, f in ipairs(SETTING_FIELDS) do
    args[#args + 1] = f
    args[#args + 1] = ARGV[2 + i]
  end
  redis.call('HSET', META, unpack(args))
  local s = settings()
  -- The epoch (SPEC 2.2, "Places that survive the store"): Redis's own microsecond clock when the queue
  -- is made, so a queue made again after the store lost it (or after a delete) has another one, and the
  -- tickets of the old epoch tell their entries that their places were lost. Below 2^53: exact in Lua and
  -- in JSON.
  local t = redis.call('TIME')
  redis.call('HSET', META, 'seq', '0', 'ready', '0', 'claimed', '0', 'cs', '0',
    'credit', int(capacity(s)), 'refilled', int(now), 'last_ms', int(now),
    'epoch', int(tonumber(t[1]) * 1000000 + tonumber(t[2])))
  return true
end

-- The queue's epoch (0 for a queue made before epochs existed).
local function epoch()
  return tonumber(redis.call('HGET', META, 'epoch') or '0')
end

-- Where a member stands, for its ticket: its waiting score, 'A' while it holds a token, '' otherwise.
local function place_of(st)
  if st.kind == 'W' then return int(st.seq) end
  if st.kind == 'R' or st.kind == 'C' then return 'A' end
  return ''
end

local function encode(st)
  if st.kind == 'R' then
    return table.concat({'R', st.nonce, st.digest, int(st.issued), int(st.expires), st.expired_claim}, '|')
  elseif st.kind == 'C' then
    return table.concat({'C', st.nonce, st.digest, int(st.issued), int(st.expires), st.claim,
      int(st.claim_expires)}, '|')
  end
  return table.concat({'X', st.claim, int(st.at)}, '|')
end

local function deadline_of(st)
  if st.kind == 'R' then return st.expires end
  if st.kind == 'C' then return st.claim_expires end
  if st.kind == 'X' then return st.at + CONSUMED_MEMORY_MS end
  return nil
end

-- How long a waiting member may go unseen (s): the queue's setting, else the default.
local function abandon_seconds()
  return redis.call('HGET', META, 'abandon') or ARGV[11]
end

-- Replaces a member's state, keeping the waiting set, holder records, deadlines and counters in step. A
-- waiting member's deadline is when it counts as abandoned (touch_waiting in queue_base.lua moves it).
local function set_state(member, old, new, now)
  if old.kind == 'W' then
    redis.call('ZREM', WAITING, member)
    redis.call('ZREM', DEADLINES, member)
  elseif old.kind ~= 'N' then
    redis.call('HDEL', HOLDERS, member)
    redis.call('ZREM', DEADLINES, member)
  end
  if old.kind == 'R' then redis.call('HINCRBY', META, 'ready', -1) end
  if old.kind == 'C' then redis.call('HINCRBY', META, 'claimed', -1) end
  if new.kind == 'R' then redis.call('HINCRBY', META, 'ready', 1) end
  if new.kind == 'C' then redis.call('HINCRBY', META, 'claimed', 1) end
  if new.kind == 'N' then return end
  if new.kind == 'W' then
    redis.call('ZADD', WAITING, 'NX', int(new.seq), member)
    redis.call('ZADD', DEADLINES, int(abandon_deadline(now, abandon_seconds())), member)
    -- NX: a checkpoint keeps the first sequence of its millisecond (enter_fast.lua adds them too).
    redis.call('ZADD', ARRIVALS, 'NX', int(new.seq), int(now))
    redis.call('HSET', META, 'arr_ms', int(now))
    return
  end
  redis.call('HSET', HOLDERS, member, encode(new))
  redis.call('ZADD', DEADLINES, int(deadline_of(new)), member)
end

-- After a claim ends unconsumed: READY again while the token is valid, else gone.
local function after_release(st, expired_claim, now)
  if now < st.expires then
    return {kind = 'R', nonce = st.nonce, digest = st.digest, issued = st.issued, expires = st.expires,
      expired_claim = expired_claim}
  end
  return {kind = 'N'}
end

-- Expired tokens free their slot, expired claims are released, consumed members are forgotten, waiting
-- members unseen for abandonAfterSeconds are dropped (counted in the meta field 'abandoned'); at most
-- MAX_EXPIRIES of them. Returns tokens expired, claims released, 1 if more were due than handled, and the
-- members dropped as abandoned.
local function expire_due(now)
  local tokens, claims, abandoned = 0, 0, 0
  local due = redis.call('ZRANGEBYSCORE', DEADLINES, '-inf', int(now), 'LIMIT', 0, MAX_EXPIRIES)
  local more = 0
  if #due == MAX_EXPIRIES then more = 1 end
  for _, member in ipairs(due) do
    local st = state_of(member)
    local nxt = nil
    if st.kind == 'R' then
      if not (now < st.expires) then
        nxt = {kind = 'N'}
        tokens = tokens + 1
      end
    elseif st.kind == 'C' then
      if st.claim_expires <= now then
        nxt = after_release(st, st.claim, now)
        claims = claims + 1
      end
    elseif st.kind == 'X' then
      nxt = {kind = 'N'}
    elseif st.kind == 'W' then
      nxt = {kind = 'N'}
      abandoned = abandoned + 1
    end
    if nxt then
      set_state(member, st, nxt, now)
    else
      redis.call('ZREM', DEADLINES, member)
      if st.kind == 'R' or st.kind == 'C' then
        redis.call('ZADD', DEADLINES, int(deadline_of(st)), member)
      end
    end
  end
  if abandoned > 0 then redis.call('HINCRBY', META, 'abandoned', abandoned) end
  return tokens, claims, more, abandoned
end

-- The queue's earliest deadline (token or claim expiry, forgetting a consumed member, a waiting member's
-- abandonment) as text, '' when it has none: schedulers visit a queue nobody waits in only when it is due.
local function next_deadline()
  local first = redis.call('ZRANGE', DEADLINES, 0, 0, 'WITHSCORES')
  if #first == 0 then return '' end
  return first[2]
end

-- Refills the admission budget (integer micro-members) up to now; returns the credit.
local function refill(s, now)
  local credit = hnum(META, 'credit')
  local at = hnum(META, 'refilled')
  if now > at then
    credit = math.min(credit + (now - at) * s.rate_milli, capacity(s))
    redis.call('HSET', META, 'credit', int(credit), 'refilled', int(now))
  end
  return credit
end

-- How long the head of the line has waited (ms); drops arrival checkpoints wholly before the head.
local function oldest_wait_ms(now)
  local head = redis.call('ZRANGE', WAITING, 0, 0, 'WITHSCORES')
  if not head[1] then
    redis.call('DEL', ARRIVALS)
    redis.call('HDEL', META, 'arr_ms')
    return 0
  end
  local head_seq = tonumber(head[2])
  local cover = redis.call('ZREVRANGEBYSCORE', ARRIVALS, int(head_seq), '-inf', 'WITHSCORES', 'LIMIT', 0, 1)
  if cover[1] then
    redis.call('ZREMRANGEBYSCORE', ARRIVALS, '-inf', '(' .. cover[2])
  else
    cover = redis.call('ZRANGE', ARRIVALS, 0, 0)
  end
  local arrived = now
  if cover[1] then arrived = tonumber(cover[1]) end
  return math.max(now - arrived, 0)
end

-- What a member sees, for the scripts that just changed it (see view_of).
local function view(member, now)
  local st = state_of(member)
  local waiting = redis.call('ZCARD', WAITING)
  local rank = -1
  if st.kind == 'W' then rank = redis.call('ZRANK', WAITING, member) end
  local e = redis.call('HMGET', META, 'aps', 'max_active', 'paused', 'ar', 'cr', 'mw', 'wv')
  e.mw, e.wv = e[6], e[7]
  return view_of(st, rank, waiting, now, e)
end

-- The entry of enter.lua (and restore.lua's when no place comes back): a member not in the queue (or
-- remembered as consumed) waits at the back under the queue's next sequence; a waiting one was seen.
-- Returns 1 when it entered now.
local function enter_member(member, st, now)
  if st.kind == 'N' or st.kind == 'X' then
    local seq = redis.call('HINCRBY', META, 'seq', 1) - 1
    set_state(member, st, {kind = 'W', seq = seq}, now)
    return 1
  elseif st.kind == 'W' then
    -- Entering again is a visit: the member was seen.
    touch_waiting(member, now, abandon_seconds())
  end
  return 0
end

-- The entrants commitment of an empty pre-queue: SHA-256 of nothing (Lua has no SHA-256; the draw
-- conformance suite holds this equal to rankgate_core's entrants_commitment of an empty list).
local EMPTY_ENTRANTS_COMMITMENT = 'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855'

-- Step 2 of a scheduled opening's draw (crate::queue::draw), the close, once opensAt has come: B = next
-- sequence, K0 = waiting, next sequence := L = B + K0, so whoever enters from now on queues behind every
-- position the draw can write and is not an entrant. Run by the first entry at or after opensAt (the
-- close is exact, not a tick late) or else by draw_begin.lua. No drawer holds it yet. An empty pre-queue
-- is done at once, committed to the empty set. Returns true when it closed the pre-queue now.
local function close_pre_queue_if_due(now)
  local d = redis.call('HMGET', META, 'dphase', 'dopens')
  if d[1] ~= 'S' or now < tonumber(d[2]) then return false end
  local k0 = redis.call('ZCARD', WAITING)
  local b = tonumber(redis.call('HGET', META, 'seq'))
  local l = b + k0
  redis.call('HSET', META, 'seq', int(l), 'dB', int(b), 'dL', int(l), 'dk0', int(k0), 'ddrawn', '0')
  redis.call('HDEL', META, 'downer', 'dlease')
  if k0 == 0 then
    redis.call('HSET', META, 'dphase', 'F', 'dentc', EMPTY_ENTRANTS_COMMITMENT, 'dentn', '0')
  else
    redis.call('HSET', META, 'dphase', 'C')
  end
  return true
end
