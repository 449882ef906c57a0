-- Redis script: the naive per-event ranking design, one EVALSHA per event, driven by redis-benchmark with
-- a random event id (issue 13's ingest baseline; bench/issue13.sh loads it and runs
--   redis-benchmark -c 50 -r 1000000000 EVALSHA <sha> 2 <prefix>:seen <prefix>: __rand_int__).
-- The same steps as crates/bench/src/bin/naive_redis.rs, which replays the seed-lesson workload instead:
--   1. SADD the id into the processed set; a repeat stops here (dedupe);
--   2. HINCRBY the event's metric(s) of its product (views, likes, or units and sales);
--   3. HMGET the metrics back and recompute the popular score views*0.1 + likes*0.2 + ln(1+sales)*0.7;
--   4. ZADD that score into the `all` ranking and the product's category ranking.
-- redis-benchmark has one random range for every __rand_int__, so the product (20,000), its category (50)
-- and the event type (30 views : 4 likes : 10 sales, the seed lesson's mix) are derived from the id.
-- The hash and category keys are built here rather than passed as KEYS: fine on a standalone Redis, which
-- is what the baseline runs on.
-- KEYS[1]: processed-id set; KEYS[2]: key prefix. ARGV[1]: event id.
if redis.call('SADD', KEYS[1], ARGV[1]) == 0 then return 0 end
local n = tonumber(ARGV[1])
local product = 'p' .. (n % 20000)
local hash = KEYS[2] .. 'm:' .. product
local kind = n % 44
if kind < 30 then
  redis.call('HINCRBY', hash, 'views', 1)
elseif kind < 34 then
  redis.call('HINCRBY', hash, 'likes', 1)
else
  redis.call('HINCRBY', hash, 'units', 1)
  redis.call('HINCRBY', hash, 'sales', 500 + n % 199500)
end
local m = redis.call('HMGET', hash, 'views', 'likes', 'sales')
local v = tonumber(m[1]) or 0
local l = tonumber(m[2]) or 0
local s = tonumber(m[3]) or 0
if s < 0 then s = 0 end
local score = v * 0.1 + l * 0.2 + math.log(1 + s) * 0.7
redis.call('ZADD', KEYS[2] .. 'z:all', score, product)
redis.call('ZADD', KEYS[2] .. 'z:c' .. (n % 50), score, product)
return 1
