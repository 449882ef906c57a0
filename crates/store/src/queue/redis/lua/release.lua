-- release: ARGV[12] member, [13] claim digest. {0} back to READY; {1} token expired meanwhile, gone;
-- {2} already released (the claim that last ended on this READY token); {3} unknown claim; {4} already
-- consumed by this claim. Exactly the ids consume.lua knows are known here (MemberState::release).
if redis.call('EXISTS', META) == 0 then return {3} end
local now = guarded_now()
local member, claim = ARGV[12], ARGV[13]
local st = state_of(member)
if st.kind == 'C' then
  if not ct_eq(st.claim, claim) then return {3} end
  -- Remember the released claim, as an expired one is: a late consume is honoured, a retry is a no-op.
  local nxt = after_release(st, claim, now)
  set_state(member, st, nxt, now)
  if nxt.kind == 'R' then return {0} end
  return {1}
end
if st.kind == 'R' and ct_eq(st.expired_claim, claim) then return {2} end
if st.kind == 'X' and ct_eq(st.claim, claim) then return {4} end
return {3}
