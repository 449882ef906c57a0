-- position: ARGV[11] member. An unknown queue answers NOT_ENTERED and creates nothing.
if redis.call('EXISTS', META) == 0 then return missing_view(clock_now()) end
local now = guarded_now()
return view(ARGV[11], now)
