-- Moves the active-version pointer of the span groups a publisher holds, fenced by their leases.
-- KEYS: the active hash, then the lease of each group named in ARGV[9..].
-- ARGV: owner, generation, asOf ms ("-" = none), popular policy version, depth ("" = full), ttl ms, mode
-- ("switch": the groups point at a generation just built in full; "stamp": their generation got newer
-- data, only if each still points at it), the rebuild request a switch answers, then the groups'
-- fields (g<index>). A group's field holds "generation asOf popular rebuilt".
-- Returns the new sequence number, -1 when the caller no longer holds every lease, -2 when a group's
-- field is gone or points at another generation (data lost, or another publisher switched).
for i = 2, #KEYS do
  if redis.call('GET', KEYS[i]) ~= ARGV[1] then return -1 end
end
local markers = {}
for i = 9, #ARGV do
  markers[i] = ARGV[8]
  if ARGV[7] == 'stamp' then
    local current = redis.call('HGET', KEYS[1], ARGV[i])
    if not current then return -2 end
    local generation, rebuilt = string.match(current, '^(%d+) %S+ %S+ (%d+)$')
    if generation ~= ARGV[2] then return -2 end
    markers[i] = rebuilt
  end
end
local seq = redis.call('HINCRBY', KEYS[1], 'seq', 1)
for i = 9, #ARGV do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[2] .. ' ' .. ARGV[3] .. ' ' .. ARGV[4] .. ' ' .. markers[i])
end
redis.call('HSET', KEYS[1], 'depth', ARGV[5])
redis.call('PEXPIRE', KEYS[1], ARGV[6])
return seq
