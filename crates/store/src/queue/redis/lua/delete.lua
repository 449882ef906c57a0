-- delete_queue: {1} deleted, {0} did not exist. UNLINK frees a big waiting set or holder hash in a
-- background thread, so deleting a queue of a million members is O(1) work for Redis's main thread
-- (defect 17). Members' poll logs are left to expire on their own TTL.
-- The epoch is retired (KEYS[7], kept 30 days): its tickets name no place to come back to.
local existed = redis.call('EXISTS', META)
if existed == 1 then
  redis.call('SADD', KEYS[7], int(epoch()))
  redis.call('EXPIRE', KEYS[7], 2592000)
end
redis.call('UNLINK', META, WAITING, HOLDERS, DEADLINES, ARRIVALS, ADMITTED)
return {existed}
