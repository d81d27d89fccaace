-- Sliding window log: exact.
-- KEYS[1]  unused (the limiter key itself; the log lives beside it)
-- KEYS[2]  sorted set: one member per admitted unit, scored with the µs time it was admitted;
--          members are "<now_us>:<n>", unique (only the scores matter)
-- A unit counts during [t, t + period). A request of cost k is allowed when the units in the
-- window (now - period, now] plus k are at most burst.
-- Memory and time are O(burst) per key: one sorted-set entry per admitted unit (a request of
-- cost k adds k members). Measured with MEMORY USAGE on Redis 7.0: about 36 bytes a unit up to
-- 128 units (listpack), about 118 beyond (skiplist). Keep burst small, or choose another
-- algorithm.
local now, cost, limit, period, burst = parse_args()
if not now then
  return invalid_args()
end
local log = KEYS[2]
local window = string.format('(%.0f', now - period) -- scores strictly inside the window

-- 1. Read the newest entry: a key of the wrong type is deleted and counts as empty.
local newest = redis.pcall('ZRANGE', log, -1, -1, 'WITHSCORES')
if type(newest) ~= 'table' or newest.err then
  redis.call('DEL', log)
  newest = {}
end
local newest_t = tonumber(newest[2])

-- 2. Cap to the clock: entries from the future (the clock stepped back) count as admitted now.
--    A request that costs something writes that down even when denied, or those entries would
--    stay in the window until the clock caught up with them.
local stepped_back = newest_t ~= nil and newest_t > now
if stepped_back then
  newest_t = now
  if cost > 0 then
    local future = redis.call('ZRANGEBYSCORE', log, string.format('(%.0f', now), '+inf')
    for i = 1, #future do
      redis.call('ZADD', log, 'XX', now, future[i])
    end
  end
end

-- 3. Count the units in the window.
local count = redis.call('ZCOUNT', log, window, '+inf')

-- 4. Decide (a peek always passes, even over a tightened quota). A denied request consumes
--    nothing.
local allowed = cost == 0 or count + cost <= burst
local used = count
if allowed then
  used = count + cost
end

-- 5. Times. Retry: when the (count + cost - burst)-th oldest unit in the window leaves it.
--    Reset: when the newest one leaves it.
local retry = 0
if not allowed then
  if cost > burst then
    retry = -1
  else
    local oldest = redis.call('ZRANGEBYSCORE', log, window, '+inf', 'WITHSCORES', 'LIMIT',
      count + cost - burst - 1, 1)
    retry = math.min(tonumber(oldest[2]), now) + period - now
  end
end
local reset = 0
if allowed and cost > 0 then
  reset = period
elseif count > 0 then
  reset = newest_t + period - now
end

-- 6. Write: drop the units that left the window, add one member per unit (NX, and more if a
--    name was taken), expire when the newest unit leaves the window.
if allowed and cost > 0 then
  redis.call('ZREMRANGEBYSCORE', log, '-inf', string.format('%.0f', now - period))
  local n, added = count, 0
  while added < cost do
    local members = {}
    for _ = 1, math.min(cost - added, 1000) do
      n = n + 1
      members[#members + 1] = now
      members[#members + 1] = string.format('%.0f:%.0f', now, n)
    end
    added = added + redis.call('ZADD', log, 'NX', unpack(members))
  end
end
if cost > 0 and (allowed or stepped_back) then
  expire(log, reset)
end
return reply(allowed, limit, math.max(0, burst - used), retry, reset)
