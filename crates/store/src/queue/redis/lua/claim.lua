-- claim: ARGV[12] member, [13] presented token digest, [14] new claim digest.
-- {0, expires} claimed; {1} no token; {2} wrong token; {3} expired; {4} already consumed; {5} already claimed.
if redis.call('EXISTS', META) == 0 then return {1} end
local now = guarded_now()
local member, presented, claim = ARGV[12], ARGV[13], ARGV[14]
local st = state_of(member)
local expires = now + settings().claim_ttl_ms
if st.kind == 'N' or st.kind == 'W' then return {1} end
if st.kind == 'X' then return {4} end
if st.kind == 'C' then
  if ct_eq(st.digest, presented) then return {5} end
  return {2}
end
if not ct_eq(st.digest, presented) then return {2} end
if not (now < st.expires) then return {3} end
set_state(member, st, {kind = 'C', nonce = st.nonce, digest = st.digest, issued = st.issued, expires = st.expires,
  claim = claim, claim_expires = expires}, now)
return {0, expires}
