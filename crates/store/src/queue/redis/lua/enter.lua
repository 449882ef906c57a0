-- enter: ARGV[12] member. Answers {entered, created, view, epoch, place} (place_of in queue_common.lua). Atomic and idempotent: the state check and ZADD NX run in one script, so fifty
-- concurrent first entries produce one position; the sequence comes from this queue's own counter.
-- ARGV[13] '1' allows creating the queue: the caller has first reserved it a place in the registry under
-- max_queues (register.lua); with '0' a missing queue answers {-1} and nothing is written.
if ARGV[13] ~= '1' and redis.call('EXISTS', META) == 0 then return {-1} end
local created = ensure_queue(clock_now())
local now = guarded_now()
local member = ARGV[12]
-- An entry at or after a scheduled opening's time closes its pre-queue first, so it queues behind it.
close_pre_queue_if_due(now)
local entered = enter_member(member, state_of(member), now)
local st = state_of(member)
return {entered, created and 1 or 0, view(member, now), epoch(), place_of(st)}
