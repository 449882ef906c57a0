-- Helpers every waiting-room, job and limiter script shares (prepended in Rust before the script's own
-- prelude, so each script stays one EVALSHA). ARGV[1] of every such script is the injected now in ms, or ''
-- for Redis TIME.

-- Integers as decimal strings; '%d' is much cheaper than '%.0f' for the integral values scripts handle.
local function int(x)
  if x == math.floor(x) and x > -9e15 and x < 9e15 then return string.format('%d', x) end
  return string.format('%.0f', x)
end

local function split(s)
  local out, start = {}, 1
  while true do
    local i = string.find(s, '|', start, true)
    if not i then
      out[#out + 1] = string.sub(s, start)
      return out
    end
    out[#out + 1] = string.sub(s, start, i - 1)
    start = i + 1
  end
end

local function clock_now()
  if ARGV[1] ~= '' then return tonumber(ARGV[1]) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
