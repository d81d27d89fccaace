-- Fixed window.
-- KEYS[1]  hash: w = µs start of the window the count belongs to, n = units admitted in it
-- Windows of period_us aligned to the Unix epoch: [w, w + period) with w = now - now % period.
-- Capacity per window is burst (which defaults to limit). Up to 2 * burst can pass across a
-- window boundary; choose a sliding algorithm when that matters.
local now, cost, limit, period, burst = parse_args()
if not now then
  return invalid_args()
end
local key = KEYS[1]

-- 1. The current window.
local start = now - now % period
local stop = start + period

-- 2. Read the count. A missing or corrupt state, or one of another window (an earlier one, or
--    a later one after the clock stepped back), is an empty window.
local stored = read_fields(key, 'w', 'n')
local w, n = stored_number(stored[1]), stored_number(stored[2])
if w ~= start or n == nil then
  n = 0
end

-- 3. Cap to the current quota.
n = math.min(math.floor(n), burst)

-- 4. Decide: add the cost only when it fits. A denied request consumes nothing.
local allowed = n + cost <= burst
if allowed then
  n = n + cost
end

-- 5. Times: a denied request fits in the next window; an empty window is already full.
local retry = 0
if not allowed then
  if cost > burst then
    retry = -1
  else
    retry = stop - now
  end
end
local reset = 0
if n > 0 then
  reset = stop - now
end

-- 6. Write only what changed; the key expires with its window.
if allowed and cost > 0 then
  redis.call('HSET', key, 'w', start, 'n', n)
  expire(key, reset)
end
return reply(allowed, limit, burst - n, retry, reset)
