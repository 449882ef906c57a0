-- Moves the active-version pointer, fenced by the publisher lease.
-- KEYS: active hash, lease.  ARGV: owner, generation, asOf ms ("" = none), popular policy version,
-- depth ("" = full), ttl ms, mode ("switch": point at a new generation; "stamp": say that the current
-- generation got newer data, only if it IS still current).
-- Returns the new sequence number, -1 when the caller no longer holds the lease, -2 when the pointer is
-- gone or points elsewhere (data lost, or another publisher switched).
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return -1 end
if ARGV[7] == 'stamp' and redis.call('HGET', KEYS[1], 'generation') ~= ARGV[2] then return -2 end
local seq = redis.call('HINCRBY', KEYS[1], 'seq', 1)
redis.call('HSET', KEYS[1], 'generation', ARGV[2], 'asOf', ARGV[3], 'popular', ARGV[4], 'depth', ARGV[5])
if ARGV[7] == 'switch' then redis.call('HDEL', KEYS[1], 'rebuild') end
redis.call('PEXPIRE', KEYS[1], ARGV[6])
return seq
