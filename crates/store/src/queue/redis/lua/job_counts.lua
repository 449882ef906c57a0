-- counts: {ready, processing, dead, parked}, read together.
return {redis.call('ZCARD', READY), redis.call('ZCARD', PROCESSING), redis.call('ZCARD', DEAD),
  redis.call('ZCARD', PARKED)}
