-- Applies one publication batch to the spans of ONE category (one hash slot), atomically.
--
-- KEYS[1]               the category's totals hash for this generation (field = span, value = "p u r")
-- KEYS[2 + 4(i-1) ..]   span i: popular zset, units zset, revenue zset, detail hash
-- ARGV[1]               number of spans
-- per span, a header:   field, mode, ttl ms, total popular, total units, total revenue,
--                       entries popular, entries units, entries revenue, detail entries
-- then its entries:     (member, ascending key or "" to remove) per ranker, then (member, detail or "")
--
-- mode: 0 = apply changes, 1 = replace a new span, 2 = replace a span published before. Modes 0 and 2
-- need the span to exist already: when the totals hash has no field for it, the data was lost (Redis restarted empty, flushed, evicted) and the script writes nothing and
-- answers "LOST", so the caller rebuilds instead of patching a hole. Returns the number of member writes.
local totals = KEYS[1]
local spans = tonumber(ARGV[1])
local HEADER = 10
local CHUNK = 1000

-- Pass 1: locate each span's header and refuse the whole batch if any change-only span is missing.
local headers = {}
local pos = 2
for i = 1, spans do
  local h = pos
  local entries = 0
  for r = 0, 2 do entries = entries + tonumber(ARGV[h + 6 + r]) end
  entries = entries + tonumber(ARGV[h + 9])
  headers[i] = h
  if ARGV[h + 1] ~= '1' and redis.call('HEXISTS', totals, ARGV[h]) == 0 then
    return 'LOST'
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
for i = 1, spans do
  local h = headers[i]
  local field = ARGV[h]
  local replace = ARGV[h + 1] ~= '0'
  local ttl = tonumber(ARGV[h + 2])
  local base = 2 + 4 * (i - 1)
  if replace then
    redis.call('DEL', KEYS[base], KEYS[base + 1], KEYS[base + 2], KEYS[base + 3])
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
        if #rems >= CHUNK then flush_zrem(key, rems); rems = {} end
      else
        adds[#adds + 1] = score
        adds[#adds + 1] = member
        if #adds >= 2 * CHUNK then flush_zadd(key, adds); adds = {} end
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
      if #dels >= CHUNK then flush_hdel(detail, dels); dels = {} end
    else
      sets[#sets + 1] = member
      sets[#sets + 1] = value
      if #sets >= 2 * CHUNK then flush_hset(detail, sets); sets = {} end
    end
  end
  flush_hset(detail, sets)
  flush_hdel(detail, dels)
  writes = writes + count
  redis.call('HSET', totals, field, ARGV[h + 3] .. ' ' .. ARGV[h + 4] .. ' ' .. ARGV[h + 5])
  for k = base, base + 3 do
    redis.call('PEXPIRE', KEYS[k], ttl)
  end
  if ttl > longest_ttl then longest_ttl = ttl end
end
if redis.call('PTTL', totals) < longest_ttl then
  redis.call('PEXPIRE', totals, longest_ttl)
end
return writes
