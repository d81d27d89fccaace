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
-- A pure step, spliced into the driver (lua/common.lua): reads stored (its state from byte
-- sat on), now, cost, limit, period, burst; sets ok, rem, re, rs and state (nil: nothing to
-- write).

  -- 1. The current window: the one of now, or the stored one when it starts after now by at most
  --    MAX_SKEW µs (`Clock::MAX_SKEW`, src/clock.rs): another instance's clock runs ahead of this
  --    one (skew), so the step decides as of that window's first µs (nothing rolls, nothing goes
  --    backwards) and its times still count from this caller's now. A window further ahead is
  --    one of a clock that stepped back: empty here.
  local MAX_SKEW, t = 5000000, now
  local tag, w, sc, sp
  if stored and #stored == sat + 24 then
    tag, w, sc, sp = sunpack('<Bddd', stored, sat)
    if tag == 119 and w > now and w - now <= MAX_SKEW and w % period == 0 then
      t = w
    end
  end
  local start = t - t % period
  local elapsed = t - start

  -- 2. Read the counts: a missing or corrupt state, or one of a later window (the clock stepped
  --    back), is empty. Capped to the current quota. Then roll: the current window becomes the
  --    previous one; older counts are forgotten.
  local c, p = 0, 0
  if tag == 119 and sc >= 0 and sc < MAX_EXACT and sp >= 0 and sp < MAX_EXACT then
    -- floor and min without calls into math (see lua/common.lua)
    if w == start then
      c, p = sc - sc % 1, sp - sp % 1
    elseif w == start - period then
      p = sc - sc % 1
    end
    if c > burst then
      c = burst
    end
    if p > burst then
      p = burst
    end
  end

  -- 3. Decide (a peek always passes: the estimate can exceed burst after the clock stepped
  --    back). A denied request consumes nothing.
  local share = p * (period - elapsed - 1) / period
  share = share - share % 1
  local allowed = cost == 0 or c + share + cost <= burst
  -- The retry waits for rc units, counted from the window that starts at rbase µs, to weigh at
  -- most rroom; the reset for zc units from zbase to weigh nothing (nil: no wait; step 4d).
  local retry, rc, rroom, rbase = 0, nil, nil, nil
  if allowed then
    c = c + cost
  elseif cost > burst then
    retry = -1
  elseif c + cost <= burst then
    -- 4a. Retry within this window, once the previous window's share leaves room.
    rc, rroom, rbase = p, burst - c - cost, start
  else
    -- 4b. Retry in the next window, where this window's count is the previous one.
    rc, rroom, rbase = c, burst - cost, start + period
  end

  -- 4c. Reset: until both counts have faded out (the key expires then).
  local reset, zc, zbase = 0, nil, nil
  if c > 0 then
    zc, zbase = c, start + period
  elseif share > 0 then
    zc, zbase = p, start
  end

  -- 4d. The fades: the first elapsed µs e of a window at which `count` units of the window
  --     before weigh at most `room` (floor(count * (period - e - 1) / period) <= room), within
  --     [0, period - 1] (at period - 1 they weigh 0). The division estimates it; the comparison
  --     settles it (room is whole: floor(x) <= room is x < room + 1). Written out twice, for
  --     the retry and for the reset (room 0): a helper function would be a closure built on
  --     every call, and a loop over both costs the admissions, which need only the reset.
  if rc then
    local x = period - 1 - (rroom + 1) * period / rc
    local e = 0
    if x >= 0 then
      e = x - x % 1 + 1
    end
    if e >= period then
      e = period - 1
    end
    if rc * (period - e - 1) / period >= rroom + 1 then
      e = e + 1
    elseif e > 0 and rc * (period - e) / period < rroom + 1 then
      e = e - 1
    end
    retry = rbase + e - now
  end
  if zc then
    local x = period - 1 - period / zc
    local e = 0
    if x >= 0 then
      e = x - x % 1 + 1
    end
    if e >= period then
      e = period - 1
    end
    if zc * (period - e - 1) / period >= 1 then
      e = e + 1
    elseif e > 0 and zc * (period - e) / period < 1 then
      e = e - 1
    end
    reset = zbase + e - now
  end

  -- 5. The new state: only an admission that costs changes it. A previous count that weighs
  --    nothing now weighs nothing for the rest of the window: stored as 0, the state an
  --    expired key would have.
  local left = burst - share - c
  if left < 0 then
    left = 0
  end
  ok, rem, re, rs = allowed, left, retry, reset
  if allowed and cost > 0 then
    if share == 0 then
      p = 0
    end
    state = spack('<Bddd', 119, start, c, p)
  end
-- @refund
-- A refund, spliced into lua/refund.lua: reads state (this tier's, of this tag and length),
-- units, start, period, burst; sets new (nil: unchanged). The count of the window the units
-- were reserved in, at least 0: the current one's when the stored window is it, the previous
-- one's when the stored window is the next; nothing otherwise.
      local _, w, c, p = sunpack('<Bddd', state)
      if c >= 0 and p >= 0 and c < MAX_EXACT and p < MAX_EXACT then
        if w == start then
          new = spack('<Bddd', 119, w, math.max(c - units, 0), p)
        elseif w == start + period then
          new = spack('<Bddd', 119, w, c, math.max(p - units, 0))
        end
      end
