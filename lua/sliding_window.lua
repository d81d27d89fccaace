-- Sliding window counter (Cloudflare's approximation of a sliding window).
-- State 'w' + doubles w (µs start of the current fixed window), c (units admitted in it) and p
-- (units admitted in the window before it). Fixed windows of period_us aligned to the Unix
-- epoch; elapsed = now - w. The sliding window is (now - period, now]; the previous fixed
-- window still has period - elapsed - 1 of its µs inside it, so it weighs that share:
--   estimate = p * (period - elapsed - 1) / period + c
-- A request of cost k is admitted when floor(estimate) + k <= burst (for k = 1: while the
-- estimate is below burst, Cloudflare's rule: 42 * 0.75 + 18 = 49.5 < 50 is admitted). So a
-- client at or below the rate is never denied in steady state, even on a window's first µs.
-- The previous window's share is rounded down (an integer division, exact while p * period <
-- 2^52); in any interval of one period at most 2 * burst pass, and at most burst per window.
-- A pure step, spliced into the driver (lua/common.lua): reads stored, now, cost, limit,
-- period, burst; sets ok, rem, re, rs and state (nil: nothing to write).

-- The first elapsed µs of a window at which `count` units of the previous window weigh at most
-- `room` (floor(count * (period - e - 1) / period) <= room), within [0, period - 1] (at
-- period - 1 they weigh 0). The division estimates it; the comparison settles it.
local function fade(count, room, period)
  local e = max(0, floor(period - 1 - (room + 1) * period / count) + 1)
  if e >= period then
    e = period - 1
  end
  if floor(count * (period - e - 1) / period) > room then
    e = e + 1
  elseif e > 0 and floor(count * (period - e) / period) <= room then
    e = e - 1
  end
  return e
end

  -- 1. The current window.
  local start = now - now % period
  local elapsed = now - start

  -- 2. Read the counts: a missing or corrupt state, or one of a later window (the clock stepped
  --    back), is empty. Capped to the current quota. Then roll: the current window becomes the
  --    previous one; older counts are forgotten.
  local c, p = 0, 0
  if stored and #stored == 25 then
    local tag, w, sc, sp = sunpack('<Bddd', stored)
    if tag == 119 and sc >= 0 and sc < MAX_EXACT and sp >= 0 and sp < MAX_EXACT then
      if w == start then
        c, p = min(floor(sc), burst), min(floor(sp), burst)
      elseif w == start - period then
        p = min(floor(sc), burst)
      end
    end
  end

  -- 3. Decide (a peek always passes: the estimate can exceed burst after the clock stepped
  --    back). A denied request consumes nothing.
  local share = floor(p * (period - elapsed - 1) / period)
  local allowed = cost == 0 or c + share + cost <= burst
  local retry = 0
  if allowed then
    c = c + cost
  elseif cost > burst then
    retry = -1
  elseif c + cost <= burst then
    -- 4a. Retry within this window, once the previous window's share leaves room.
    retry = start + fade(p, burst - c - cost, period) - now
  else
    -- 4b. Retry in the next window, where this window's count is the previous one.
    retry = start + period + fade(c, burst - cost, period) - now
  end

  -- 4c. Reset: until both counts have faded out (the key expires then).
  local reset = 0
  if c > 0 then
    reset = start + period + fade(c, 0, period) - now
  elseif share > 0 then
    reset = start + fade(p, 0, period) - now
  end

  -- 5. The new state: only an admission that costs changes it. A previous count that weighs
  --    nothing now weighs nothing for the rest of the window: stored as 0, the state an
  --    expired key would have.
  ok, rem, re, rs = allowed, max(0, burst - share - c), retry, reset
  if allowed and cost > 0 then
    if share == 0 then
      p = 0
    end
    state = spack('<Bddd', 119, start, c, p)
  end
