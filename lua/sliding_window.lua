-- Sliding window counter (Cloudflare's approximation of a sliding window).
-- KEYS[1]  hash: w = µs start of the current fixed window, c = units admitted in it,
--          p = units admitted in the window before it
-- Fixed windows of period_us aligned to the Unix epoch. The units in the sliding window
-- (now - period, now] are estimated as  p * (period - elapsed) / period + c,  elapsed = now - w:
-- the previous window weighted by the part of it still inside the sliding window. A request of
-- cost k is allowed when estimate + k <= burst. Everything is compared multiplied by period, in
-- integers (exact while burst * period < 2^53), so a full burst is never lost to rounding.
local now, cost, limit, period, burst = parse_args()
if not now then
  return invalid_args()
end
local key = KEYS[1]

-- 1. The current window.
local start = now - now % period
local elapsed = now - start

-- 2. Read the counts: a missing or corrupt state, or one of a later window (the clock stepped
--    back), is empty. Capped to the current quota.
local stored = read_fields(key, 'w', 'c', 'p')
local w, c, p = stored_number(stored[1]), stored_number(stored[2]), stored_number(stored[3])
if w == nil or c == nil or p == nil or w > start then
  w, c, p = start, 0, 0
end
c = math.min(math.floor(c), burst)
p = math.min(math.floor(p), burst)

-- 3. Roll: the current window becomes the previous one; older counts are forgotten.
if w == start - period then
  c, p = 0, c
elseif w ~= start then
  c, p = 0, 0
end

-- 4. Decide. room = (burst - weighted previous count) * period. A peek always passes (the
--    estimate can exceed burst after the clock stepped back). A denied request consumes nothing.
local room = burst * period - p * (period - elapsed)
local allowed = cost == 0 or (c + cost) * period <= room
if allowed then
  c = c + cost
end

-- 5. Times. Retry: the first µs at which the estimate leaves room for `cost`. Within this
--    window the previous count's weight falls linearly: solve p * (period - e) <= (burst - c -
--    cost) * period for the elapsed time e. If even a zero weight is not enough, solve the same
--    in the next window, where this window's count c is the previous one. One µs later if
--    rounding says otherwise: never early. Reset: when both counts have faded out.
local retry = 0
if not allowed then
  if cost > burst then
    retry = -1
  elseif c + cost <= burst then
    local e = period - math.floor((burst - c - cost) * period / p)
    if (c + cost) * period > burst * period - p * (period - e) then
      e = e + 1
    end
    retry = start + e - now
  else
    local e = math.max(0, period - math.floor((burst - cost) * period / c))
    if cost * period > burst * period - c * (period - e) then
      e = e + 1
    end
    retry = start + period + e - now
  end
end
local reset = 0
if c > 0 then
  reset = start + 2 * period - now
elseif p > 0 then
  reset = start + period - now
end

-- 6. Write only what changed; the key expires when both counts have faded out.
if allowed and cost > 0 then
  redis.call('HSET', key, 'w', start, 'c', c, 'p', p)
  expire(key, reset)
end
return reply(allowed, limit, math.max(0, math.floor(room / period) - c), retry, reset)
