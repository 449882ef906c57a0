-- consume: ARGV[12] member, [13] claim digest. {0} consumed; {1} already (idempotent); {2} unknown claim
-- (also a claim that is not the one that consumed the token: MemberState::consume).
if redis.call('EXISTS', META) == 0 then return {2} end
local now = guarded_now()
local member, claim = ARGV[12], ARGV[13]
local st = state_of(member)
if (st.kind == 'C' and ct_eq(st.claim, claim)) or (st.kind == 'R' and ct_eq(st.expired_claim, claim)) then
  set_state(member, st, {kind = 'X', claim = claim, at = now}, now)
  redis.call('HINCRBY', META, 'cs', 1)
  return {0}
end
if st.kind == 'X' and ct_eq(st.claim, claim) then return {1} end
return {2}
