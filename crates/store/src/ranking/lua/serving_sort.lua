-- Several products' places in a served ranking, in one round trip (POST /v1/rankings/sort).
-- KEYS: zset, detail hash, totals hash (one category: one hash tag, one slot).
-- ARGV: span field, ranker slot (1..), then the products.
-- Returns false when the span is not served in this generation; else
-- {total, {rank or -1, ...}, {key or "", ...}, {detail or false, ...}}, one entry per product in order.
local totals = redis.call('HGET', KEYS[3], ARGV[1])
if not totals then return false end
local t = {}
for n in string.gmatch(totals, '%S+') do t[#t + 1] = n end
local products = {}
for i = 3, #ARGV do products[#products + 1] = ARGV[i] end
-- ZMSCORE answers every key at once; only held products cost a rank lookup.
local keys = redis.call('ZMSCORE', KEYS[1], unpack(products))
local ranks = {}
local shown = {}
for i = 1, #products do
  if keys[i] then
    ranks[i] = redis.call('ZRANK', KEYS[1], products[i])
    shown[i] = keys[i]
  else
    ranks[i] = -1
    shown[i] = ''
  end
end
local details = redis.call('HMGET', KEYS[2], unpack(products))
return {t[tonumber(ARGV[2])], ranks, shown, details}
