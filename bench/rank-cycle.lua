-- wrk script: the same reads in every run, for callgrind's counts (bench/rank_callgrind.sh), where
-- rank-random.lua's products are seeded by the clock. GET /v1/products/p<n>/rank?$RANK_QUERY for p0, p1, …
-- p(PRODUCTS-1), then from p0 again (default 20000 products, category=all&window=7d); with READ_PATH set,
-- GET $READ_PATH every time instead (a top page). With STOP=N the thread stops after N answers: wrk's
-- "requests in" is then N or a few more, and up to -c minus 1 requests already sent are answered by the
-- server uncounted. One wrk thread (-t1): the sequence is the thread's.
--   STOP=20000 wrk -t1 -c10 -d600s --timeout 60s -s bench/rank-cycle.lua http://127.0.0.1:8080
local products = tonumber(os.getenv("PRODUCTS") or "20000")
local query = os.getenv("RANK_QUERY") or "category=all&window=7d"
local fixed = os.getenv("READ_PATH")
local stop = tonumber(os.getenv("STOP") or "0")

-- One concatenation per request instead of wrk.format (see queue-enter.lua).
local tail
local n = -1
request = function()
  if not tail then
    tail = " HTTP/1.1\r\nHost: " .. wrk.host .. ":" .. wrk.port .. "\r\n\r\n"
  end
  if fixed then
    return "GET " .. fixed .. tail
  end
  n = (n + 1) % products
  return "GET /v1/products/p" .. n .. "/rank?" .. query .. tail
end

local answers = 0
if stop > 0 then
  response = function()
    answers = answers + 1
    if answers == stop then
      wrk.thread:stop()
      -- wrk's main thread sleeps out -d whatever its threads do; SIGINT ends that sleep. Sent from the
      -- background after os.execute returns: system() ignores SIGINT in wrk while the shell runs. The
      -- shell's parent, $PPID, is wrk.
      os.execute("(sleep 0.2; kill -INT $PPID) &")
    end
  end
end
