-- delete_queue: {1} deleted, {0} did not exist. UNLINK frees a big waiting set or holder hash in a
-- background thread, so deleting a queue of a million members is O(1) work for Redis's main thread
-- (defect 17). Members' poll logs are left to expire on their own TTL.
local existed = redis.call('EXISTS', META)
redis.call('UNLINK', META, WAITING, HOLDERS, DEADLINES, ARRIVALS, ADMITTED)
return {existed}
