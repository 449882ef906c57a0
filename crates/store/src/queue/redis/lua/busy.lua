-- busy: {1} if anybody waits or holds a token (READY / CLAIMED), else {0}. The caller's check after it
-- took the queue out of the active set: a member who entered meanwhile puts it back.
if redis.call('EXISTS', META) == 0 then return {0} end
if redis.call('ZCARD', WAITING) > 0 then return {1} end
if (hnum(META, 'ready') or 0) + (hnum(META, 'claimed') or 0) > 0 then return {1} end
return {0}
