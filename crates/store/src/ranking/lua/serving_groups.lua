-- Registers a publisher and deals the span groups out among the live ones.
-- KEYS[1]: the publishers zset (owner -> expiry, ms of Redis time); KEYS[2]: the deal hash (`live`: the
-- publishers it was made for, `at`: when, g<i>: the owner of group i); KEYS[3]: the groups' measured
-- costs (g<i> -> engine microseconds plus member writes published so far); KEYS[4..]: the lease of
-- group 0, 1, ...
-- ARGV: owner, ttl ms, 'join' (register, hold this owner's share) or 'leave' (give everything up),
-- redeal ms (a deal older than this is made again from the costs measured meanwhile), settled (the
-- measured cost from which on costs are trusted: a deal made with fewer is made again once there are).
-- A deal is made when the live publishers change, once the costs first settle, or when it is old (or
-- the costs doubled since) and a new one would lighten the heaviest publisher by a tenth: groups by
-- measured cost, heaviest first, each to the publisher with the least cost so far (ties: the first by
-- id), so every publisher gets about the same work. A group still leased to a former holder is not
-- taken: that holder gives it up at its next call, or its lease runs out. Returns the (0-based)
-- groups `owner` holds now.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local owner, ttl, redeal, settled = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[4]), tonumber(ARGV[5])
local groups = #KEYS - 3
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if ARGV[3] == 'leave' then
  redis.call('ZREM', KEYS[1], owner)
else
  redis.call('ZADD', KEYS[1], now + ttl, owner)
  redis.call('PEXPIRE', KEYS[1], ttl * 4)
end
local live = redis.call('ZRANGE', KEYS[1], 0, -1)
table.sort(live)
local signature = table.concat(live, ',')
local owners = {}
local costs, order, total = {}, {}, 0
for g = 0, groups - 1 do
  costs[g] = 1 + (tonumber(redis.call('HGET', KEYS[3], 'g' .. g)) or 0)
  total = total + costs[g]
  order[#order + 1] = g
end
local dealt = redis.call('HMGET', KEYS[2], 'live', 'at', 'total')
local dealt_total = tonumber(dealt[3]) or 0
local unsettled = dealt_total < settled and total >= settled
-- Early costs are a poor guide (spans grow, categories arrive), so besides the periodic deal one is
-- tried each time the measured total has doubled since the last: a handful over a fleet's life.
local grown = dealt_total >= settled and total >= 2 * dealt_total
local stale = grown or now - (tonumber(dealt[2]) or 0) > redeal
-- The heaviest publisher's load under an assignment (owner per group), at today's costs.
local function heaviest(owner_of)
  local loads, most = {}, 0
  for g = 0, groups - 1 do
    local o = owner_of(g)
    if o then
      loads[o] = (loads[o] or 0) + costs[g]
      if loads[o] > most then most = loads[o] end
    end
  end
  return most
end
if #live > 0 and (dealt[1] ~= signature or stale or unsettled) then
  table.sort(order, function(a, b)
    if costs[a] ~= costs[b] then return costs[a] > costs[b] end
    return a < b
  end)
  local load = {}
  for i = 1, #live do load[i] = 0 end
  local fields = {'live', signature, 'at', now, 'total', total}
  for _, g in ipairs(order) do
    local least = 1
    for i = 2, #live do
      if load[i] < load[least] then least = i end
    end
    load[least] = load[least] + costs[g]
    owners[g] = live[least]
    fields[#fields + 1] = 'g' .. g
    fields[#fields + 1] = live[least]
  end
  -- Moving a group makes its new holder rebuild everything it holds: with the same publishers, a
  -- periodic deal is kept only if it lightens the heaviest publisher by a tenth.
  local keep = false
  if dealt[1] == signature and not unsettled then
    local before = heaviest(function(g) return redis.call('HGET', KEYS[2], 'g' .. g) end)
    keep = heaviest(function(g) return owners[g] end) > 0.9 * before
  end
  if keep then
    for g = 0, groups - 1 do owners[g] = redis.call('HGET', KEYS[2], 'g' .. g) end
    redis.call('HSET', KEYS[2], 'at', now, 'total', total)
  else
    redis.call('DEL', KEYS[2])
    redis.call('HSET', KEYS[2], unpack(fields))
  end
else
  for g = 0, groups - 1 do owners[g] = redis.call('HGET', KEYS[2], 'g' .. g) end
end
redis.call('PEXPIRE', KEYS[2], ttl * 4)
local held = {}
for g = 0, groups - 1 do
  local key = KEYS[g + 4]
  local current = redis.call('GET', key)
  if owners[g] == owner then
    if current == false or current == owner then
      redis.call('SET', key, owner, 'PX', ttl)
      held[#held + 1] = g
    end
  elseif current == owner then
    redis.call('DEL', key)
  end
end
return held
