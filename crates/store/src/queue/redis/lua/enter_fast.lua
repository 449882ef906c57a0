-- enter, the hot path: ARGV[2] member. Handles the two common cases with as few commands as possible: a
-- member the queue does not know (ZADD NX + the queue's own sequence, in this one atomic script) and a member
-- already waiting (their position; nothing is written). Anything else (the queue does not exist yet, or the
-- member holds or has just consumed a token) answers {-1} having changed nothing, and the caller runs
-- enter.lua, the full entry, which is itself one atomic script and checks everything again.
-- Returns {entered, 0, view} like enter.lua.
local member = ARGV[2]
local e = redis.call('HMGET', META, 'aps', 'max_active', 'paused', 'ar', 'cr', 'last_ms', 'seq', 'arr_ms')
if not e[1] then return {-1} end
if redis.call('HEXISTS', HOLDERS, member) == 1 then return {-1} end
local now = clock_now()
local last = tonumber(e[6])
if last and last > now then now = last end
local seq = tonumber(e[7])
if redis.call('ZADD', WAITING, 'NX', int(seq), member) == 0 then
  -- Already waiting: their position, and the sequence is not spent.
  return {0, 0, view_of({kind = 'W'}, redis.call('ZRANK', WAITING, member), redis.call('ZCARD', WAITING), now, e)}
end
if tonumber(e[8]) ~= now then
  -- The first entry of this millisecond: its checkpoint for the oldest-wait gauge (NX keeps the first).
  redis.call('ZADD', ARRIVALS, 'NX', int(seq), int(now))
  redis.call('HSET', META, 'seq', int(seq + 1), 'last_ms', int(now), 'arr_ms', int(now))
else
  redis.call('HSET', META, 'seq', int(seq + 1), 'last_ms', int(now))
end
local waiting = redis.call('ZCARD', WAITING)
-- Sequences only grow and only entries assign them, so the newcomer is last in line.
return {1, 0, view_of({kind = 'W'}, waiting - 1, waiting, now, e)}
