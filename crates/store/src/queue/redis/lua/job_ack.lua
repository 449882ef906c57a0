-- ack: ARGV[2] id, [3] claim token. 1 done, 0 stale.
guarded_now()
local id = ARGV[2]
local r = get_record(id)
if not r or r.token ~= ARGV[3] or not redis.call('ZSCORE', PROCESSING, id) then return 0 end
redis.call('ZREM', PROCESSING, id)
redis.call('HDEL', RECORDS, id)
redis.call('HDEL', PAYLOADS, id)
redis.call('HDEL', REASONS, id)
return 1
