-- GCRA, the generic cell rate algorithm (as in governor, redis_rate, redis-cell).
-- KEYS[1]  hash: at = µs time the debt was last measured (an integer),
--                d  = the debt then, in emission intervals (requests), 0 < d <= burst
-- Emission interval T = period / limit; tolerance = burst * T. The theoretical arrival time is
-- tat = at + d * T. A request of cost c is allowed when now >= max(tat, now) + c*T - burst*T,
-- i.e. when the debt left at now plus c is at most burst; then tat = max(tat, now) + c*T, i.e.
-- the debt grows by c.
-- Why a debt counted in requests instead of one absolute tat in µs: a double near 1.8e15 has a
-- resolution of 0.25 µs, so with T = 0.001 µs (10^9 per second) adding T would be lost; and T is
-- inexact for most quotas (1/11 s), so T + T + ... drifts past burst * T and a full burst would
-- be denied its last request. Costs add to the debt exactly.
local now, cost, limit, period, burst = parse_args()
if not now then
  return invalid_args()
end
local key = KEYS[1]

-- 1. Read the state: a missing or corrupt one is a fresh key (no debt).
local stored = read_fields(key, 'at', 'd')
local at, d = stored_number(stored[1]), stored_number(stored[2])
if at == nil or d == nil then
  at, d = now, 0
end

-- 2. Cap to the current quota and clock. A clock stepped back moves `at` to now, keeping the
--    debt; that move is written even on a denial, or each call would move it again and the
--    debt would not drain until the clock caught up.
d = math.min(d, burst)
local stepped_back = at > now
at = math.min(at, now)

-- 3. Drain the debt at limit per period, the elapsed time capped at the time to pay it off.
--    Once paid off the clock stops: idle time earns no credit beyond burst.
local to_zero = math.ceil(d * period / limit)
local debt
if now - at >= to_zero then
  at, d, debt = now, 0, 0
else
  debt = math.max(0, d - (now - at) * limit / period)
end

-- 4. Decide. A denied request consumes nothing.
local allowed = debt + cost <= burst
local used = debt
if allowed then
  used = debt + cost
  if cost > 0 then
    at, d = now, used
  end
end

-- 5. Times: until the debt leaves room for `cost` (the smallest elapsed time since `at` at
--    which step 3 drains enough, one µs later if rounding says otherwise: never early), and
--    until the debt is paid off.
local retry = 0
if not allowed then
  if cost > burst then
    retry = -1
  else
    local e = math.ceil((d + cost - burst) * period / limit)
    if e < to_zero and d - e * limit / period + cost > burst then
      e = e + 1
    end
    retry = at + e - now
  end
end
local reset = 0
if d > 0 then
  reset = at + math.ceil(d * period / limit) - now
end

-- 6. Write only what changed; the key expires when its debt is paid off (a fresh key).
if cost > 0 and (allowed or stepped_back) then
  redis.call('HSET', key, 'at', at, 'd', d)
  expire(key, reset)
end
return reply(allowed, limit, math.floor(burst - used), retry, reset)
