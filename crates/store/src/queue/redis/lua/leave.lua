-- leave: ARGV[12] member. Returns {0} not present, {1, status} left, {2} refused (claim in flight).
if redis.call('EXISTS', META) == 0 then return {0} end
local now = guarded_now()
local member = ARGV[12]
local st = state_of(member)
if st.kind == 'N' or st.kind == 'X' then return {0} end
if st.kind == 'C' then return {2} end
local status = STATUS[st.kind]
set_state(member, st, {kind = 'N'}, now)
return {1, status}
