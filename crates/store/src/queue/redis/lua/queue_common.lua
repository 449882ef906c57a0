-- Shared prelude of every waiting-room script (prepended in Rust, so each script stays one EVALSHA).
-- KEYS (all carry the hash tag {rg:q:<queue>}, so they live in one slot):
--   1 meta (hash: settings, sequence, counters, budget, estimator, monotonic clock)
--   2 waiting (zset member -> arrival sequence)
--   3 holders (hash member -> READY / CLAIMED / CONSUMED record)
--   4 deadlines (zset member -> next deadline ms)
--   5 arrivals (zset "ms" -> first sequence that arrived in that millisecond)
--   6 admitted (hash second -> members admitted in that second, last 60 s)
-- ARGV: 1 injected now ms ('' = Redis TIME), 2 consumed memory ms, 3..10 default settings; script args from 11.
local META, WAITING, HOLDERS, DEADLINES, ARRIVALS, ADMITTED = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local MICRO = 1000000
local MAX_EXPIRIES = 10000
local SMOOTHING_MILLIS = 10000.0
local CONSUMED_MEMORY_MS = tonumber(ARGV[2])
local SETTING_FIELDS = {'aps', 'rate_milli', 'tick', 'token_ttl', 'claim_ttl', 'max_active', 'paused', 'fail_mode'}
local STATUS = {N = 0, W = 1, R = 2, C = 3, X = 0}

local function int(x) return string.format('%.0f', x) end
local function flt(x) return string.format('%.17g', x) end

local function split(s)
  local out, start = {}, 1
  while true do
    local i = string.find(s, '|', start, true)
    if not i then
      out[#out + 1] = string.sub(s, start)
      return out
    end
    out[#out + 1] = string.sub(s, start, i - 1)
    start = i + 1
  end
end

-- Constant-time comparison of two hex digests.
local function ct_eq(a, b)
  if #a ~= #b or #a == 0 then return false end
  local diff = 0
  for i = 1, #a do
    diff = bit.bor(diff, bit.bxor(string.byte(a, i), string.byte(b, i)))
  end
  return diff == 0
end

local function clock_now()
  if ARGV[1] ~= '' then return tonumber(ARGV[1]) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function hnum(key, field)
  local v = redis.call('HGET', key, field)
  if v then return tonumber(v) end
  return nil
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
  redis.call('HSET', META, 'seq', '0', 'ready', '0', 'claimed', '0', 'cs', '0',
    'credit', int(capacity(s)), 'refilled', int(now), 'last_ms', int(now))
  return true
end

-- Member records: R|nonce|digest|issued|expires|expired-claim, C|nonce|digest|issued|expires|claim|claim-expires,
-- X|claim|at. Digests and nonces are lowercase hex; only hashes of tokens and claim ids are ever stored.
local function state_of(member)
  local seq = redis.call('ZSCORE', WAITING, member)
  if seq then return {kind = 'W', seq = tonumber(seq)} end
  local raw = redis.call('HGET', HOLDERS, member)
  if not raw then return {kind = 'N'} end
  local f = split(raw)
  if f[1] == 'R' then
    return {kind = 'R', nonce = f[2], digest = f[3], issued = tonumber(f[4]), expires = tonumber(f[5]),
      expired_claim = f[6]}
  elseif f[1] == 'C' then
    return {kind = 'C', nonce = f[2], digest = f[3], issued = tonumber(f[4]), expires = tonumber(f[5]),
      claim = f[6], claim_expires = tonumber(f[7])}
  elseif f[1] == 'X' then
    return {kind = 'X', claim = f[2], at = tonumber(f[3])}
  end
  error('corrupt member record')
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

-- Replaces a member's state, keeping the waiting set, holder records, deadlines and counters in step.
local function set_state(member, old, new, now)
  if old.kind == 'W' then
    redis.call('ZREM', WAITING, member)
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
    local last = redis.call('ZRANGE', ARRIVALS, -1, -1)
    if not last[1] or tonumber(last[1]) ~= now then
      redis.call('ZADD', ARRIVALS, int(new.seq), int(now))
    end
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

-- Expired tokens free their slot, expired claims are released, consumed members are forgotten.
local function expire_due(now)
  local tokens, claims = 0, 0
  local due = redis.call('ZRANGEBYSCORE', DEADLINES, '-inf', int(now), 'LIMIT', 0, MAX_EXPIRIES)
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
  return tokens, claims
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

-- What a member sees: status, rank, waiting count, token nonce/expiry, last outcome, now, and the settings
-- and measured rates the caller turns into a wait estimate.
local function view(member, now)
  local st = state_of(member)
  local waiting = redis.call('ZCARD', WAITING)
  local status, rank, nonce, expires, last = STATUS[st.kind], -1, '', 0, 0
  if st.kind == 'W' then
    rank = redis.call('ZRANK', WAITING, member)
  elseif st.kind == 'R' then
    if now < st.expires then
      nonce, expires = st.nonce, st.expires
    else
      status = 0
    end
  elseif st.kind == 'C' then
    nonce, expires = st.nonce, st.expires
  elseif st.kind == 'X' then
    last = 1
  end
  local e = redis.call('HMGET', META, 'aps', 'max_active', 'paused', 'ar', 'cr')
  return {status, rank, waiting, nonce, expires, last, now, e[1] or '', e[2] or '', e[3] or '', e[4] or '', e[5] or ''}
end

local function missing_view(now)
  return {0, -1, 0, '', 0, 0, now, '', '', '', '', ''}
end
