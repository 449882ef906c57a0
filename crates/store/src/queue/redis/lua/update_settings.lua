-- update_settings: ARGV[11..18] the patch, one per setting field ('' keeps a field; max_active takes 'keep',
-- 'none' or a number). Validated by the caller. Settles the budget at the old rate, then caps it to the new
-- tick's capacity. Returns {created, settings...}.
local created = ensure_queue(clock_now())
local now = guarded_now()
refill(settings(), now)
local fields = {}
for i, f in ipairs(SETTING_FIELDS) do
  local v = ARGV[10 + i]
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
if #fields > 0 then redis.call('HSET', META, unpack(fields)) end
local s = settings()
redis.call('HSET', META, 'credit', int(math.min(hnum(META, 'credit'), capacity(s))))
local out = {created and 1 or 0}
for i = 1, #SETTING_FIELDS do out[#out + 1] = s.raw[i] end
return out
