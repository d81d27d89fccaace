-- GCRA, the generic cell rate algorithm (as in governor, redis_rate, redis-cell).
-- State 'g' + doubles at (µs time the debt was last measured, an integer) and d (the debt
-- then, in emission intervals, i.e. requests; 0 < d <= burst).
-- Emission interval T = period / limit; tolerance = burst * T. The theoretical arrival time is
-- tat = at + d * T. A request of cost c is allowed when now >= max(tat, now) + c*T - burst*T,
-- i.e. when the debt left at now plus c is at most burst; then tat = max(tat, now) + c*T, i.e.
-- the debt grows by c.
-- Why a debt counted in requests instead of one absolute tat in µs: a double near 1.8e15 has a
-- resolution of 0.25 µs, so with T = 0.001 µs (10^9 per second) adding T would be lost; and T is
-- inexact for most quotas (1/11 s), so T + T + ... drifts past burst * T and a full burst would
-- be denied its last request. Costs add to the debt exactly.
-- A pure step, spliced into the driver (lua/common.lua): reads stored (its state from byte
-- sat on), now, cost, limit, period, burst; sets ok, rem, re, rs and state (nil: nothing to
-- write).
  -- 1. Read the state: a missing or corrupt one is a fresh key (no debt).
  local at, d = now, 0
  if stored and #stored == sat + 16 then
    local tag, a, b = sunpack('<Bdd', stored, sat)
    if tag == 103 and a >= 0 and a < MAX_EXACT and b >= 0 and b < MAX_EXACT then
      at, d = a, b
    end
  end

  -- 2. Cap to the current quota and clock. An `at` ahead of now is another instance's clock
  --    running ahead of this one (skew) when it is at most MAX_SKEW µs ahead (`Clock::MAX_SKEW`,
  --    src/clock.rs): the step decides as of `at` (`t`), so nothing drains and nothing goes
  --    backwards, and its times still count from this caller's now. Further ahead, this clock
  --    stepped back: `at` moves to now, keeping the debt; that move is written even on a denial,
  --    or each call would move it again and the debt would not drain until the clock caught up.
  if d > burst then
    d = burst
  end
  local MAX_SKEW, t = 5000000, now
  local stepped_back = at - now > MAX_SKEW
  if stepped_back then
    at = now
  elseif at > now then
    t = at
  end

  -- 3. Drain the debt at limit per period up to t, the elapsed time capped at the time to pay it
  --    off. Once paid off the clock stops: idle time earns no credit beyond burst.
  local to_zero = d * period / limit
  local frac = to_zero % 1 -- ceil, without a call into math (see lua/common.lua)
  to_zero = to_zero - frac
  if frac > 0 then
    to_zero = to_zero + 1
  end
  local debt
  if t - at >= to_zero then
    at, d, debt = t, 0, 0
  else
    debt = d - (t - at) * limit / period
    if debt < 0 then
      debt = 0
    end
  end

  -- 4. Decide. A denied request consumes nothing.
  local allowed = debt + cost <= burst
  local used, retry = debt, 0
  if allowed then
    used = debt + cost
    if cost > 0 then
      at, d = t, used
    end
  elseif cost > burst then
    retry = -1
  else
    -- 5a. Retry: the smallest whole elapsed time e since `at` at which step 3 leaves room for
    --     `cost`, so that a request at now + retry is allowed and one a µs earlier is not. The
    --     division estimates it; the same comparison as steps 3 and 4 settles it (rounding can
    --     put the estimate a µs off either way; beyond 2^53 a µs is below the doubles' step).
    local e = math.min(to_zero, math.max(0, math.ceil((d + cost - burst) * period / limit)))
    if e < to_zero and d - e * limit / period + cost > burst then
      e = e + 1
    elseif e > 0 and d - (e - 1) * limit / period + cost <= burst then
      e = e - 1
    end
    retry = at + e - now
  end

  -- 5b. Reset: until the debt is paid off (the key expires then).
  local reset = 0
  if d > 0 then
    local paid = d * period / limit
    frac = paid % 1 -- ceil, as above
    paid = paid - frac
    if frac > 0 then
      paid = paid + 1
    end
    reset = at + paid - now
  end

  -- 6. The new state: only what changed (an admission that costs, or a repaired clock).
  local left = burst - used
  ok, rem, re, rs = allowed, left - left % 1, retry, reset
  if cost > 0 and (allowed or stepped_back) then
    state = spack('<Bdd', 103, at, d)
  end
-- @refund
-- A refund, spliced into lua/refund.lua: reads state (this tier's, of this tag and length),
-- units, start, period, burst; sets new (nil: unchanged). Debt - units, at least 0 (draining
-- commutes with the subtraction, so at stays).
      local _, a, b = sunpack('<Bdd', state)
      if a >= 0 and b >= 0 and a < MAX_EXACT and b < MAX_EXACT then
        new = spack('<Bdd', 103, a, math.max(b - units, 0))
      end
