-- wrk script: GET /v1/queues/$QUEUE/entries/<member> for the members queue-enter.lua entered (same
-- QB_PREFIX and wrk thread count), each member once and in entry order. The per-member poll limiter answers
-- 429 to a second poll inside the polling interval, so run it for less time than the entry run took to
-- fill the queue and check that wrk reports no non-2xx responses.
--   QB_PREFIX=r1 wrk -t1 -c50 -d5s --latency -s bench/queue-position.lua http://127.0.0.1:8080
local queue = os.getenv("QUEUE") or "bench"
local prefix = os.getenv("QB_PREFIX") or "qb"
local threads = 0

function setup(thread)
  thread:set("tid", threads)
  threads = threads + 1
end

-- One concatenation per request instead of wrk.format (see queue-enter.lua).
local head, tail
local n = 0
request = function()
  if not head then
    head = "GET /v1/queues/" .. queue .. "/entries/" .. prefix .. "-" .. tid .. "-"
    tail = " HTTP/1.1\r\nHost: " .. wrk.host .. ":" .. wrk.port .. "\r\n\r\n"
  end
  n = n + 1
  return head .. n .. tail
end
