-- Base prelude of every waiting-room script (prepended in Rust, so each script stays one EVALSHA). The hot
-- scripts (enter_fast.lua, position.lua, poll.lua) use only this file; every other script also gets queue_common.lua.
-- KEYS (all carry the hash tag {rg:q:<queue>}, so they live in one slot):
--   1 meta (hash: settings, sequence, counters, budget, estimator, monotonic clock)
--   2 waiting (zset member -> arrival sequence)
--   3 holders (hash member -> READY / CLAIMED / CONSUMED record)
--   4 deadlines (zset member -> next deadline ms)
--   5 arrivals (zset "ms" -> first sequence that arrived in that millisecond; the newest ms is also in the
--     meta field arr_ms, so most entries need not look at this set)
--   6 admitted (hash second -> members admitted in that second, last 60 s)
-- ARGV: 1 injected now ms ('' = Redis TIME); the hot scripts' own args from 2. The other scripts also get
-- 2 consumed memory ms and 3..11 default settings, their own args from 12 (see queue_common.lua).
local META, WAITING, HOLDERS, DEADLINES, ARRIVALS, ADMITTED = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local STATUS = {N = 0, W = 1, R = 2, C = 3, X = 0}

-- Member records: R|nonce|digest|issued|expires|expired-claim, C|nonce|digest|issued|expires|claim|claim-expires,
-- X|claim|at. Digests and nonces are lowercase hex; only hashes of tokens and claim ids are ever stored.
-- holder_state reads the record of a member known not to be waiting.
local function holder_state(member)
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

-- Status, token nonce, token expiry and last outcome of a member in state st at `now`.
local function fields_of(st, now)
  local status, nonce, expires, last = STATUS[st.kind], '', 0, 0
  if st.kind == 'R' then
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
  return status, nonce, expires, last
end

-- What a member sees (read_view in waiting.rs): status, rank, waiting count, token nonce/expiry, last outcome,
-- now, then e[1..5] = the meta fields aps, max_active, paused, ar, cr and e.mw, e.wv (measured ms, window
-- variance) that the caller turns into a wait estimate and its P90.
local function view_of(st, rank, waiting, now, e)
  local status, nonce, expires, last = fields_of(st, now)
  if st.kind ~= 'W' then rank = -1 end
  return {status, rank, waiting, nonce, expires, last, now, e[1] or '', e[2] or '', e[3] or '', e[4] or '', e[5] or '',
    e.mw or '', e.wv or ''}
end

-- The head of a batch reply (enter_fast.lua, poll.lua; ViewHead::read_batch in waiting.rs): what every member of
-- the batch shares, sent once: now, the waiting count after the batch, and e[1..5], e.mw, e.wv as in view_of
-- (nine fields).
local function batch_head(now, waiting, e)
  if not e then return {now, 0, '', '', '', '', '', '', ''} end
  return {now, waiting, e[1] or '', e[2] or '', e[3] or '', e[4] or '', e[5] or '', e.mw or '', e.wv or ''}
end

-- A member who starts waiting at `now` counts as abandoned abandonAfterSeconds later plus the slack: a
-- twentieth of that, at most a minute (QueueSettings::abandon_slack_millis). `abandon` is the queue's
-- setting in seconds.
local function abandon_deadline(now, abandon)
  local a = tonumber(abandon) * 1000
  return now + a + math.min(a / 20, 60000)
end

-- A waiting member was seen (a poll, a stream's read, an entry again): it counts as abandoned no sooner
-- than abandonAfterSeconds from now. The deadline moves only when it would fall short of that, and then to
-- abandon_deadline, so a member polling every few seconds costs a ZSCORE per poll and a ZADD (a move in a
-- set as large as the queue) once per slack. The embedded touch_waiting is the same rule. `abandon` is nil
-- only for a queue stored before the setting existed and not yet ticked; its first tick writes it.
local function touch_waiting(member, now, abandon)
  if not abandon then return end
  local deadline = redis.call('ZSCORE', DEADLINES, member)
  if not deadline or tonumber(deadline) < now + tonumber(abandon) * 1000 then
    redis.call('ZADD', DEADLINES, int(abandon_deadline(now, abandon)), member)
  end
end

-- The meta fields a position read needs, the queue's guarded now, and the store clock as read (before the
-- queue's guard; the poll limiter guards it per log key instead): e = {aps, max_active, paused, ar, cr,
-- last_ms, abandon, mw = measured ms, wv = window variance}, or nil when the queue does not exist. Read once
-- per script, however many members it answers.
local function read_meta()
  local e = redis.call('HMGET', META, 'aps', 'max_active', 'paused', 'ar', 'cr', 'last_ms', 'abandon', 'mw', 'wv')
  e.mw, e.wv = e[8], e[9]
  local clock = clock_now()
  local now = clock
  if not e[1] then return nil, now, clock end
  local last = tonumber(e[6])
  if last and last > now then now = last end
  return e, now, clock
end

-- One member's status, rank (-1 unless waiting), token nonce, token expiry and last outcome, given
-- read_meta's answer: ZRANK, and the holder record only for a member who is not waiting. An unknown queue
-- answers NOT_ENTERED and creates nothing. The queue's monotonic guard is recorded only when the answer
-- depends on a token's expiry (READY, CLAIMED), so a later claim can never run on an earlier clock than this
-- answer did; e[6] then carries the recorded value, so one script records it once. A waiting member's
-- answer does not depend on the time; the common poll writes only the member's abandonment deadline.
local function member_position(member, e, now)
  if not e then return 0, -1, '', 0, 0 end
  local rank = redis.call('ZRANK', WAITING, member)
  if rank then
    touch_waiting(member, now, e[7])
    return 1, rank, '', 0, 0
  end
  local st = holder_state(member)
  local last = tonumber(e[6])
  if (st.kind == 'R' or st.kind == 'C') and not (last and last >= now) then
    redis.call('HSET', META, 'last_ms', int(now))
    e[6] = int(now)
  end
  local status, nonce, expires, done = fields_of(st, now)
  return status, -1, nonce, expires, done
end
