-- wrk script: GET /v1/queues/$QUEUE/entries/<member> for the members queue-enter.lua entered (same
-- QB_PREFIX and wrk thread count), each member once and in entry order. The per-member poll limiter answers
-- 429 to a second poll inside the polling interval, so run it for less time than the entry run took to
-- fill the queue and check that wrk reports no non-2xx responses.
-- Each poll shows the member's ticket (SPEC 2.2), read from TICKETS_IN, the file queue-enter.lua wrote
-- with TICKETS_OUT.
--   QB_PREFIX=r1 TICKETS_IN=t wrk -t1 -c50 -d5s --latency -s bench/queue-position.lua http://127.0.0.1:8080
--
-- Every request is built in `init`, before wrk starts its clock, and `request` only hands the next one
-- out, as redis-benchmark prepares its commands: building each one per call (a table lookup among a
-- million tickets and five string concatenations, each interned by LuaJIT) kept wrk's core 94% busy at
-- 127k polls/s, so the row measured the load generator's tail. The collector is stopped once the
-- requests are built: each of its cycles walked the million strings while every answer waited (p99
-- 1.6-2.9 ms with it, 1.1-1.5 ms without, the server's own handler histogram unchanged).
local queue = os.getenv("QUEUE") or "bench"
local prefix = os.getenv("QB_PREFIX") or "qb"
local threads = 0

function setup(thread)
  thread:set("tid", threads)
  threads = threads + 1
end

local requests = {}
local missing

function init(args)
  local tickets = {}
  local tickets_in = os.getenv("TICKETS_IN")
  if tickets_in then
    for line in io.lines(tickets_in) do
      local member, ticket = line:match("^(%S+) (%S+)$")
      if member then
        tickets[member] = ticket
      end
    end
  end
  local head = "GET /v1/queues/" .. queue .. "/entries/"
  local host = " HTTP/1.1\r\nHost: " .. wrk.host .. ":" .. wrk.port .. "\r\nX-Queue-Ticket: "
  local own = prefix .. "-" .. tid .. "-"
  local numbered = "^" .. own:gsub("%-", "%%-") .. "(%d+)$"
  for member, ticket in pairs(tickets) do
    local n = tonumber(member:match(numbered))
    if n then
      requests[n] = head .. member .. host .. ticket .. "\r\n\r\n"
    end
  end
  -- A member with no ticket (wrk reports its answer as non-2xx): the one wrk's start-up check asks for,
  -- and any past the last one entered.
  missing = function(n)
    return head .. own .. n .. host .. "\r\n\r\n"
  end
  tickets = nil
  collectgarbage("collect")
  collectgarbage("stop")
end

local n = 0
request = function()
  n = n + 1
  return requests[n] or missing(n)
end
