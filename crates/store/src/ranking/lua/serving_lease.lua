-- Takes or renews a lease (the webhook ledger's). KEYS[1]: lease. ARGV: owner, ttl ms. Returns 1 when held by owner.
local current = redis.call('GET', KEYS[1])
if current == false then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
if current == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
