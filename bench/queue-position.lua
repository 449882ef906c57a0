-- wrk script: GET /v1/queues/$QUEUE/entries/<member> for the members queue-enter.lua entered (same
-- QB_PREFIX and wrk thread count), each member once and in entry order. The per-member poll limiter answers
-- 429 to a second poll inside the polling interval, so run it for less time than the entry run took to
-- fill the queue and check that wrk reports no non-2xx responses.
-- Each poll shows the member's ticket (SPEC 2.2), read from TICKETS_IN, the file queue-enter.lua wrote
-- with TICKETS_OUT.
--   QB_PREFIX=r1 TICKETS_IN=t wrk -t1 -c50 -d5s --latency -s bench/queue-position.lua http://127.0.0.1:8080
local queue = os.getenv("QUEUE") or "bench"
local prefix = os.getenv("QB_PREFIX") or "qb"
local threads = 0

function setup(thread)
  thread:set("tid", threads)
  threads = threads + 1
end

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

-- The tickets table holds a million strings or more, and each collector cycle of wrk's LuaJIT walks it
-- while every answer waits: measured on 1M tickets, p99 1.6-2.9 ms with the collector on against
-- 1.1-1.5 ms with it stopped, the server's own handler histogram unchanged. The collector is stopped once
-- the table is built, so the poll row measures the server, as redis-benchmark's ZRANK row does; a poll
-- run allocates ~40 MB a second without it.
collectgarbage("collect")
collectgarbage("stop")

-- One concatenation per request instead of wrk.format (see queue-enter.lua).
local head, host
local n = 0
request = function()
  if not head then
    head = "GET /v1/queues/" .. queue .. "/entries/"
    host = " HTTP/1.1\r\nHost: " .. wrk.host .. ":" .. wrk.port .. "\r\nX-Queue-Ticket: "
  end
  n = n + 1
  local member = prefix .. "-" .. tid .. "-" .. n
  return head .. member .. host .. (tickets[member] or "") .. "\r\n\r\n"
end
