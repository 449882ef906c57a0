-- One page of a served ranking, with each member's details, in one round trip.
-- KEYS: zset, detail hash, totals hash.  ARGV: span field, first index, last index, ranker slot (1..3).
-- Returns false when the span is not served in this generation; else {total, {member, key, ...}, details}.
local totals = redis.call('HGET', KEYS[3], ARGV[1])
if not totals then return false end
local items = redis.call('ZRANGE', KEYS[1], ARGV[2], ARGV[3], 'WITHSCORES')
local members = {}
for i = 1, #items, 2 do members[#members + 1] = items[i] end
local details = {}
if #members > 0 then details = redis.call('HMGET', KEYS[2], unpack(members)) end
local t = {}
for n in string.gmatch(totals, '%S+') do t[#t + 1] = n end
return {t[tonumber(ARGV[4])], items, details}
