-- One product's place in a served ranking, in one round trip.
-- KEYS: zset, detail hash, totals hash.  ARGV: span field, product, ranker slot (1..3).
-- Returns false when the span is not served in this generation; else {total, rank or -1, key or "", detail or ""}.
local totals = redis.call('HGET', KEYS[3], ARGV[1])
if not totals then return false end
local t = {}
for n in string.gmatch(totals, '%S+') do t[#t + 1] = n end
local rank = redis.call('ZRANK', KEYS[1], ARGV[2])
local key = redis.call('ZSCORE', KEYS[1], ARGV[2])
local detail = redis.call('HGET', KEYS[2], ARGV[2])
return {t[tonumber(ARGV[3])], rank or -1, key or '', detail or ''}
