-- counts: {ready, processing, dead}, read together.
return {redis.call('ZCARD', READY), redis.call('ZCARD', PROCESSING), redis.call('ZCARD', DEAD)}
