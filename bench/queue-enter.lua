-- wrk script: POST /v1/queues/$QUEUE/entries with a distinct memberId per request,
-- "$QB_PREFIX-<thread>-<n>" with n = 1, 2, 3 … in each wrk thread; the rankgate side of the
-- `ZADD q NX` baseline. Run queue-position.lua afterwards with the same QB_PREFIX and thread count.
--   QB_PREFIX=r1 wrk -t1 -c50 -d10s --latency -s bench/queue-enter.lua http://127.0.0.1:8080
local queue = os.getenv("QUEUE") or "bench"
local prefix = os.getenv("QB_PREFIX") or "qb"
local threads = 0
local headers = { ["Content-Type"] = "application/json" }

function setup(thread)
  thread:set("tid", threads)
  threads = threads + 1
end

local n = 0
request = function()
  n = n + 1
  local body = string.format('{"memberId":"%s-%d-%d"}', prefix, tid, n)
  return wrk.format("POST", "/v1/queues/" .. queue .. "/entries", headers, body)
end
