-- restore: an entry by a member whose ticket names a place of an earlier epoch (SPEC 2.2, "Places that
-- survive the store"). ARGV[12] member, ARGV[13] the ticket's epoch, ARGV[14] the restored score
-- (Placement::restored_score: below every fresh arrival, in the original order), ARGV[15] '1' allows
-- creating the queue (as in enter.lua). KEYS[7] is the queue's set of retired epochs (deleted or forgotten
-- on purpose: their tickets name no place).
-- The place comes back when the queue's epoch is another, the old one was not retired, and this member has
-- not been restored from it yet (a meta field per member and lost epoch: "restores once"): a member not in
-- the queue waits again at the restored score; one waiting as a fresh arrival of this epoch moves up to it.
-- Anything else is enter.lua's entry. Answers {entered, created, view, epoch, place, restored}.
if ARGV[15] ~= '1' and redis.call('EXISTS', META) == 0 then return {-1} end
local created = ensure_queue(clock_now())
local now = guarded_now()
local member, lost, score = ARGV[12], ARGV[13], tonumber(ARGV[14])
local st = state_of(member)
local entered, restored = 0, 0
local lost_here = epoch() ~= tonumber(lost) and redis.call('SISMEMBER', KEYS[7], lost) == 0
if lost_here and (st.kind == 'N' or (st.kind == 'W' and st.seq >= 0)) then
  if redis.call('HSETNX', META, 'restored:' .. lost .. ':' .. member, '1') == 1 then
    if st.kind == 'W' then
      redis.call('ZADD', WAITING, 'XX', int(score), member)
      redis.call('ZADD', ARRIVALS, 'NX', int(score), int(now))
    else
      set_state(member, st, {kind = 'W', seq = score}, now)
      entered = 1
    end
    restored = 1
  end
end
if restored == 0 then entered = enter_member(member, st, now) end
st = state_of(member)
return {entered, created and 1 or 0, view(member, now), epoch(), place_of(st), restored}
