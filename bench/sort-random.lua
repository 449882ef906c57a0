-- wrk script: POST /v1/rankings/sort with IDS (default 100) distinct random products p0..p(PRODUCTS-1)
-- (default 20000) in the `all` category over the 7d window; the rankgate side of the ZMSCORE baseline.
--   wrk -t1 -c50 -d10s --latency -s bench/sort-random.lua http://127.0.0.1:8080
-- Bodies are made up front (BODIES of them, default 1000) so the load generator's Lua stays cheap.
local products = tonumber(os.getenv("PRODUCTS") or "20000")
local count = tonumber(os.getenv("IDS") or "100")
local bodies_wanted = tonumber(os.getenv("BODIES") or "1000")
math.randomseed(os.time())

local bodies = {}
for b = 1, bodies_wanted do
  local seen, ids = {}, {}
  while #ids < count do
    local n = math.random(0, products - 1)
    if not seen[n] then
      seen[n] = true
      ids[#ids + 1] = '"p' .. n .. '"'
    end
  end
  bodies[b] = '{"window":"7d","productIds":[' .. table.concat(ids, ",") .. ']}'
end

local next_body = 0
request = function()
  next_body = next_body % #bodies + 1
  return wrk.format("POST", "/v1/rankings/sort", { ["Content-Type"] = "application/json" }, bodies[next_body])
end
