-- position: ARGV[2] member. Read-only on the common path; see member_position. Returns view_of's layout.
local e, now = read_meta()
local waiting = e and redis.call('ZCARD', WAITING) or 0
local status, rank, nonce, expires, last = member_position(ARGV[2], e, now)
local head = batch_head(now, waiting, e)
return {status, rank, waiting, nonce, expires, last, now, head[3], head[4], head[5], head[6], head[7], head[8],
  head[9]}
