-- enter, the hot path, for a batch of members: ARGV[2..] members in arrival order (concurrent entries to one
-- queue share one call; see coalesce.rs). Handles the two common cases with as few commands as possible: a
-- member the queue does not know (ZADD NX + the queue's own sequence) and a member already waiting (their
-- position; only their abandonment deadline is written, and only when it would fall short). The whole
-- batch is one atomic script, so a member named twice in it is entered once. Anything else (the queue does not exist yet, or the member holds or has just consumed a
-- token) STOPS the batch at that member, who gets -1 having changed nothing: the caller runs enter.lua,
-- the full entry (itself one atomic script that checks everything again), and sends the members after
-- them again, so nobody behind them in line is entered ahead of them.
-- Returns batch_head, the queue's epoch, then for each member up to the first -1 its code (2 × rank + 1
-- entered now, 2 × rank already waiting, -1 for the full entry) and, unless -1, its arrival sequence (the
-- place its ticket names). Every member coded is WAITING, and the head's count is the
-- queue's after the batch (a member's rank does not change while later members join behind them).
local e = redis.call('HMGET', META, 'aps', 'max_active', 'paused', 'ar', 'cr', 'last_ms', 'seq', 'arr_ms', 'abandon',
  'mw', 'wv', 'epoch', 'dphase', 'dopens')
e.mw, e.wv = e[10], e[11]
-- No 'abandon' yet (a queue stored before the setting, not yet ticked): the full entry handles it.
if not e[1] or not e[9] then
  local out = batch_head(clock_now(), 0, nil)
  out[10] = 0
  out[11] = -1
  return out
end
local now = clock_now()
local last = tonumber(e[6])
if last and last > now then now = last end
local seq = tonumber(e[7])
local first_seq = nil
local waiting = redis.call('ZCARD', WAITING)
local codes, seqs = {}, {}
-- The batch is read and written with one command per set, not three per member: a redis.call costs about
-- as much as the command it runs. HMGET finds the first member with a record (the batch stops there),
-- ZMSCORE the ones already waiting; the newcomers go into the waiting and deadline sets in one ZADD each.
local members = {}
for i = 2, #ARGV do members[i - 1] = ARGV[i] end
local held = redis.call('HMGET', HOLDERS, unpack(members))
local stop = #members + 1
for i = 1, #members do
  if held[i] then
    stop = i
    break
  end
end
-- A scheduled opening's time has come and its pre-queue is not closed yet: the full entry closes it
-- (queue_common.lua) before anybody else joins.
if e[13] == 'S' and now >= tonumber(e[14]) then stop = 1 end
if stop > 1 then
  local scores = redis.call('ZMSCORE', WAITING, unpack(members, 1, stop - 1))
  local deadline = int(abandon_deadline(now, e[9]))
  local new_waiting, new_deadlines, fresh = {}, {}, {}
  for i = 1, stop - 1 do
    local member = members[i]
    if scores[i] then
      -- Already waiting: their position, and the sequence is not spent; they were seen.
      codes[i] = 2 * redis.call('ZRANK', WAITING, member)
      seqs[i] = scores[i]
      touch_waiting(member, now, e[9])
    elseif fresh[member] then
      -- Named twice in the batch: entered by the first mention, already waiting at the second.
      codes[i] = 2 * fresh[member][1]
      seqs[i] = fresh[member][2]
    else
      -- Sequences only grow and only entries assign them, so the newcomer is last in line.
      first_seq = first_seq or seq
      new_waiting[#new_waiting + 1] = int(seq)
      new_waiting[#new_waiting + 1] = member
      new_deadlines[#new_deadlines + 1] = deadline
      new_deadlines[#new_deadlines + 1] = member
      fresh[member] = {waiting, int(seq)}
      codes[i] = 2 * waiting + 1
      seqs[i] = int(seq)
      seq = seq + 1
      waiting = waiting + 1
    end
  end
  if #new_waiting > 0 then
    redis.call('ZADD', WAITING, 'NX', unpack(new_waiting))
    redis.call('ZADD', DEADLINES, unpack(new_deadlines))
  end
end
if stop <= #members then codes[stop] = -1 end
if first_seq then
  if tonumber(e[8]) ~= now then
    -- The first entry of this millisecond: its checkpoint for the oldest-wait gauge (NX keeps the first).
    redis.call('ZADD', ARRIVALS, 'NX', int(first_seq), int(now))
    redis.call('HSET', META, 'seq', int(seq), 'last_ms', int(now), 'arr_ms', int(now))
  else
    redis.call('HSET', META, 'seq', int(seq), 'last_ms', int(now))
  end
end
local out = batch_head(now, waiting, e)
out[10] = tonumber(e[12] or '0')
for i = 1, #codes do
  out[#out + 1] = codes[i]
  if codes[i] >= 0 then out[#out + 1] = seqs[i] end
end
return out
