-- wrk script: GET /v1/products/p<N>/rank for a random product p0..p(PRODUCTS-1) (default 20000), in the
-- `all` category over the 7d window; the rankgate side of the ZREVRANK baseline.
--   wrk -t1 -c50 -d10s --latency -s bench/rank-random.lua http://127.0.0.1:8080
local products = tonumber(os.getenv("PRODUCTS") or "20000")
local query = os.getenv("RANK_QUERY") or "category=all&window=7d"
math.randomseed(os.time())

request = function()
  return wrk.format("GET", "/v1/products/p" .. math.random(0, products - 1) .. "/rank?" .. query)
end
