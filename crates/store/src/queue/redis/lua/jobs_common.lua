-- Shared prelude of every job script. KEYS (all tagged {rg:j:<job queue>}, one slot):
--   1 ready (zset id -> due ms), 2 processing (zset id -> claim expiry ms), 3 dead (zset id -> died ms),
--   4 records (hash id -> attempts|base|max delay|max attempts|claim token), 5 payloads (hash id -> bytes),
--   6 reasons (hash id -> why it died), 7 meta (hash: the monotonic clock), 8 parked (zset id -> parked
--   ms: held while its group is paused), 9 paused (hash group -> '<since ms>|<reason>').
-- ARGV[1]: injected now ms ('' = Redis TIME); script args from 2.
local READY, PROCESSING, DEAD, RECORDS, PAYLOADS, REASONS, META, PARKED, PAUSED =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]

-- rankgate_core::job::job_group: the id up to its last ':' (the greedy '.*'), nil without one.
local function group_of(id)
  return string.match(id, '^(.*):')
end

-- Whether the job's group is paused: its job is parked instead of ready.
local function is_held(id)
  local group = group_of(id)
  return group ~= nil and redis.call('HEXISTS', PAUSED, group) == 1
end

local function guarded_now()
  local now = clock_now()
  local last = redis.call('HGET', META, 'last_ms')
  if last and tonumber(last) > now then now = tonumber(last) end
  redis.call('HSET', META, 'last_ms', int(now))
  return now
end

local function get_record(id)
  local raw = redis.call('HGET', RECORDS, id)
  if not raw then return nil end
  local f = split(raw)
  return {attempts = tonumber(f[1]), base = tonumber(f[2]), max_delay = tonumber(f[3]),
    max_attempts = tonumber(f[4]), token = f[5]}
end

local function put_record(id, r)
  redis.call('HSET', RECORDS, id,
    table.concat({int(r.attempts), int(r.base), int(r.max_delay), int(r.max_attempts), r.token}, '|'))
end

-- rankgate_core::job::retry_delay_ms: capped exponential backoff, jittered over its upper half, and not
-- shorter than min_delay (a Retry-After), a floor itself capped at the longest delay.
local function backoff(r, failures, unit, min_delay)
  local exponent = math.min(math.max(failures - 1, 0), 62)
  local capped = math.min(r.base * (2 ^ exponent), r.max_delay)
  if unit ~= unit or unit == math.huge or unit == -math.huge then unit = 0 end
  unit = math.min(math.max(unit, 0), 0.999999)
  local half = math.floor(capped / 2)
  local delay = half + math.floor((capped - half) * unit)
  if min_delay == nil or min_delay ~= min_delay or min_delay < 0 then min_delay = 0 end
  return math.max(delay, math.min(min_delay, r.max_delay))
end

-- A failed attempt (nack or reaped claim): parked while its group is paused (whatever its attempts, as
-- JobRecord::park_claimed), else retried after backoff, or dead after the last attempt.
-- Returns the retry time; nil and 'parked' when parked, nil alone when the job died.
local function after_failure(id, r, now, unit, reason, min_delay)
  redis.call('ZREM', PROCESSING, id)
  r.token = ''
  put_record(id, r)
  if is_held(id) then
    redis.call('ZADD', PARKED, int(now), id)
    return nil, 'parked'
  end
  if r.attempts >= r.max_attempts then
    redis.call('ZADD', DEAD, int(now), id)
    redis.call('HSET', REASONS, id, reason)
    return nil
  end
  local due = now + backoff(r, r.attempts, unit, min_delay)
  redis.call('ZADD', READY, int(due), id)
  return due
end
