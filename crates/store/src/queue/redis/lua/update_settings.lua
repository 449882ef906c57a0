-- update_settings: ARGV[12..20] the patch, one per setting field ('' keeps a field; max_active takes 'keep',
-- 'none' or a number); ARGV[21] the adaptive settings as JSON ('' keeps them). Validated by the caller. Settles the budget at the old rate, then caps it to the new
-- tick's capacity. Returns {created, settings...}, or {2} when the merged rate × tick would admit more than
-- MAX_MEMBERS_PER_TICK in one tick (QueueSettings::validate; checked here too because the stored settings
-- another instance just wrote are only known inside the script), changing nothing.
local MAX_MEMBERS_PER_TICK = 100000
local stored = redis.call('HMGET', META, 'rate_milli', 'tick')
local rate_milli = tonumber(ARGV[13]) or tonumber(stored[1]) or tonumber(ARGV[4])
local tick = tonumber(ARGV[14]) or tonumber(stored[2]) or tonumber(ARGV[5])
if rate_milli * tick > MAX_MEMBERS_PER_TICK * MICRO then return {2} end
local created = ensure_queue(clock_now())
local now = guarded_now()
refill(settings(), now)
local fields = {}
for i, f in ipairs(SETTING_FIELDS) do
  local v = ARGV[11 + i]
  if f == 'max_active' then
    if v == 'none' then
      fields[#fields + 1] = f
      fields[#fields + 1] = ''
    elseif v ~= 'keep' then
      fields[#fields + 1] = f
      fields[#fields + 1] = v
    end
  elseif v ~= '' then
    fields[#fields + 1] = f
    fields[#fields + 1] = v
  end
end
-- An admin configured this queue: it is never forgotten when idle (forget.lua).
fields[#fields + 1] = 'managed'
fields[#fields + 1] = '1'
if ARGV[21] and ARGV[21] ~= '' then
  fields[#fields + 1] = 'adaptive'
  fields[#fields + 1] = ARGV[21]
end
redis.call('HSET', META, unpack(fields))
local s = settings()
redis.call('HSET', META, 'credit', int(math.min(hnum(META, 'credit'), capacity(s))))
local out = {created and 1 or 0}
for i = 1, #SETTING_FIELDS do out[#out + 1] = s.raw[i] end
out[#out + 1] = redis.call('HGET', META, 'adaptive') or ''
return out
