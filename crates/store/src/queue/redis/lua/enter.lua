-- enter: ARGV[12] member. Answers {entered, created, view, epoch, place} (place_of in queue_common.lua). Atomic and idempotent: the state check and ZADD NX run in one script, so fifty
-- concurrent first entries produce one position; the sequence comes from this queue's own counter.
-- ARGV[13] '1' allows creating the queue: the caller has first reserved it a place in the registry under
-- max_queues (register.lua); with '0' a missing queue answers {-1} and nothing is written.
if ARGV[13] ~= '1' and redis.call('EXISTS', META) == 0 then return {-1} end
local created = ensure_queue(clock_now())
local now = guarded_now()
local member = ARGV[12]
local st = state_of(member)
local entered = 0
if st.kind == 'N' or st.kind == 'X' then
  local seq = redis.call('HINCRBY', META, 'seq', 1) - 1
  set_state(member, st, {kind = 'W', seq = seq}, now)
  entered = 1
elseif st.kind == 'W' then
  -- Entering again is a visit: the member was seen.
  touch_waiting(member, now, abandon_seconds())
end
st = state_of(member)
return {entered, created and 1 or 0, view(member, now), epoch(), place_of(st)}
