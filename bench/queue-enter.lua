-- wrk script: POST /v1/queues/$QUEUE/entries with a distinct memberId per request,
-- "$QB_PREFIX-<thread>-<n>" with n = 1, 2, 3 … in each wrk thread; the rankgate side of the
-- `ZADD q NX` baseline. Run queue-position.lua afterwards with the same QB_PREFIX and thread count.
-- With TICKETS_OUT=<file>, each answer's memberId and ticket (SPEC 2.2: every later call for the member
-- shows it) are appended to <file>, one "<memberId> <ticket>" per line, for queue-position.lua.
-- With XFF set, each entry carries its own X-Forwarded-For address (10.<n / 65536>.<n / 256>.<n>, each
-- octet mod 256; wrk -t1): with
-- `trusted_proxies = ["127.0.0.1"]` every entry is a new address's, so the per-address budget (issue 28)
-- is checked on every entry and never refuses one.
--   QB_PREFIX=r1 wrk -t1 -c50 -d10s --latency -s bench/queue-enter.lua http://127.0.0.1:8080
local queue = os.getenv("QUEUE") or "bench"
local prefix = os.getenv("QB_PREFIX") or "qb"
local threads = 0

function setup(thread)
  thread:set("tid", threads)
  threads = threads + 1
end

-- The request is one concatenation instead of wrk.format's table walk, so the load generator, which
-- shares the machine's cores with the server, spends as little per request as redis-benchmark does.
local head
local n = 0
local xff = os.getenv("XFF")
request = function()
  if not head then
    head = "POST /v1/queues/" .. queue .. "/entries HTTP/1.1\r\nHost: " .. wrk.host .. ":" .. wrk.port ..
      "\r\nContent-Type: application/json\r\n"
  end
  n = n + 1
  local body = '{"memberId":"' .. prefix .. "-" .. tid .. "-" .. n .. '"}'
  local forwarded = ""
  if xff then
    forwarded = "X-Forwarded-For: 10." .. (math.floor(n / 65536) % 256) .. "." .. (math.floor(n / 256) % 256) ..
      "." .. (n % 256) .. "\r\n"
  end
  return head .. forwarded .. "Content-Length: " .. #body .. "\r\n\r\n" .. body
end

local tickets_out = os.getenv("TICKETS_OUT")
if tickets_out then
  local file = io.open(tickets_out, "a")
  response = function(status, headers, body)
    local member = body:match('"memberId":"([^"]*)"')
    local ticket = body:match('"ticket":"([^"]*)"')
    if status == 200 and member and ticket then
      file:write(member, " ", ticket, "\n")
      file:flush()
    end
  end
end
