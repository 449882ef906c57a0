-- Applies pieces of span publications of ONE category (one hash slot), atomically per call.
--
-- The caller bounds every call to a fixed number of member writes, so no call blocks Redis for long: a
-- small span is one piece ('w', whole), a big one is split into pieces 'f' (first), 'm' ... , 'l' (last)
-- sent in order, one call after the other. A big *replace* is built in the span's staging keys and moved
-- over the served keys by its last piece (UNLINK + RENAME, O(1) here), so a reader sees the old span or
-- the new one, never a half-built one. A big *change* set is applied piece by piece in place, each
-- product's entries (every ranker and its detail) in the same piece.
--
-- KEYS[1]               the category's totals hash for this generation (field = span, value = "p u r")
-- KEYS[2 + 8(i-1) ..]   piece i: popular, units, revenue zsets, detail hash, then the same four staging keys
-- ARGV[1]               number of pieces
-- per piece, a header:  field, mode, ttl ms, total popular, total units, total revenue,
--                       entries popular, entries units, entries revenue, detail entries,
--                       stage (w f m l), staged members before this piece (popular units revenue detail)
-- then its entries:     (member, ascending key or "" to remove) per ranker, then (member, detail or "")
--
-- mode: 0 = apply changes, 1 = replace a new span, 2 = replace a span published before. Modes 0 and 2
-- need the span to exist already: when the totals hash has no field for it, the data was lost (Redis
-- restarted empty, flushed, evicted) and the script writes nothing and answers "LOST", so the caller
-- rebuilds instead of patching a hole. A staged piece after the first also answers "LOST" when the
-- staging keys do not hold what the earlier pieces wrote (lost between two calls). Every check runs
-- before the first write. Returns the number of member writes.
local totals = KEYS[1]
local pieces = tonumber(ARGV[1])
local HEADER = 15
local BATCH = 1000

-- Pass 1: locate each piece's header; refuse the whole call if any check fails.
local headers = {}
local pos = 2
for i = 1, pieces do
  local h = pos
  local entries = 0
  for r = 0, 2 do entries = entries + tonumber(ARGV[h + 6 + r]) end
  entries = entries + tonumber(ARGV[h + 9])
  headers[i] = h
  local mode, stage = ARGV[h + 1], ARGV[h + 10]
  if mode ~= '1' and redis.call('HEXISTS', totals, ARGV[h]) == 0 then
    return 'LOST'
  end
  if mode ~= '0' and (stage == 'm' or stage == 'l') then
    local base = 2 + 8 * (i - 1)
    for r = 0, 2 do
      if redis.call('ZCARD', KEYS[base + 4 + r]) ~= tonumber(ARGV[h + 11 + r]) then return 'LOST' end
    end
    if redis.call('HLEN', KEYS[base + 7]) ~= tonumber(ARGV[h + 14]) then return 'LOST' end
  end
  pos = h + HEADER + 2 * entries
end

local function flush_zadd(key, args)
  if #args > 0 then redis.call('ZADD', key, unpack(args)) end
end
local function flush_zrem(key, args)
  if #args > 0 then redis.call('ZREM', key, unpack(args)) end
end
local function flush_hset(key, args)
  if #args > 0 then redis.call('HSET', key, unpack(args)) end
end
local function flush_hdel(key, args)
  if #args > 0 then redis.call('HDEL', key, unpack(args)) end
end

-- Pass 2: write.
local writes = 0
local longest_ttl = 0
for i = 1, pieces do
  local h = headers[i]
  local field = ARGV[h]
  local replace = ARGV[h + 1] ~= '0'
  local ttl = tonumber(ARGV[h + 2])
  local stage = ARGV[h + 10]
  local live = 2 + 8 * (i - 1)
  -- A replace over several pieces writes into the staging keys; everything else into the served ones.
  local base = live
  if replace and stage ~= 'w' then base = live + 4 end
  if replace and (stage == 'w' or stage == 'f') then
    -- UNLINK, not DEL: freeing a big old span happens off Redis's main thread.
    redis.call('UNLINK', KEYS[base], KEYS[base + 1], KEYS[base + 2], KEYS[base + 3])
  end
  local p = h + HEADER
  for r = 0, 2 do
    local key = KEYS[base + r]
    local count = tonumber(ARGV[h + 6 + r])
    local adds, rems = {}, {}
    for _ = 1, count do
      local member, score = ARGV[p], ARGV[p + 1]
      p = p + 2
      if score == '' then
        rems[#rems + 1] = member
        if #rems >= BATCH then flush_zrem(key, rems); rems = {} end
      else
        adds[#adds + 1] = score
        adds[#adds + 1] = member
        if #adds >= 2 * BATCH then flush_zadd(key, adds); adds = {} end
      end
    end
    flush_zadd(key, adds)
    flush_zrem(key, rems)
    writes = writes + count
  end
  local detail = KEYS[base + 3]
  local count = tonumber(ARGV[h + 9])
  local sets, dels = {}, {}
  for _ = 1, count do
    local member, value = ARGV[p], ARGV[p + 1]
    p = p + 2
    if value == '' then
      dels[#dels + 1] = member
      if #dels >= BATCH then flush_hdel(detail, dels); dels = {} end
    else
      sets[#sets + 1] = member
      sets[#sets + 1] = value
      if #sets >= 2 * BATCH then flush_hset(detail, sets); sets = {} end
    end
  end
  flush_hset(detail, sets)
  flush_hdel(detail, dels)
  writes = writes + count
  for k = base, base + 3 do
    redis.call('PEXPIRE', KEYS[k], ttl)
  end
  if replace and stage == 'l' then
    -- The switch: the built span replaces the served one in this call. An empty ranking has no key.
    for k = 0, 3 do
      redis.call('UNLINK', KEYS[live + k])
      if redis.call('EXISTS', KEYS[live + 4 + k]) == 1 then
        redis.call('RENAME', KEYS[live + 4 + k], KEYS[live + k])
      end
    end
  end
  if stage == 'w' or stage == 'l' then
    redis.call('HSET', totals, field, ARGV[h + 3] .. ' ' .. ARGV[h + 4] .. ' ' .. ARGV[h + 5])
  end
  if ttl > longest_ttl then longest_ttl = ttl end
end
if redis.call('PTTL', totals) < longest_ttl then
  redis.call('PEXPIRE', totals, longest_ttl)
end
return writes
