-- Shared prelude of the rate-limiter scripts. KEYS (all tagged {rg:rl:<key>}, one slot): 1 log (zset of
-- allowed requests, unique member each), 2 window (hash bucket start -> count), 3 meta (hash: monotonic clock
-- and the log's member counter). ARGV: 1 injected now ('' = Redis TIME), 2 limit, 3 window ms, 4 buckets,
-- 5 extra key lifetime ms. Every key expires once idle for twice the window plus that slack.
local LOG, WINDOW, META = KEYS[1], KEYS[2], KEYS[3]
local LIMIT, WINDOW_MS, BUCKETS = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local TTL_MS = WINDOW_MS * 2 + tonumber(ARGV[5])

local function guarded_now()
  local now = clock_now()
  local last = redis.call('HGET', META, 'last_ms')
  if last and tonumber(last) > now then now = tonumber(last) end
  redis.call('HSET', META, 'last_ms', int(now))
  redis.call('PEXPIRE', META, int(TTL_MS))
  return now
end
