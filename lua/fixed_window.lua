-- Fixed window. State 'f' + doubles w (µs start of the window the count belongs to) and n
-- (units admitted in it). Windows of period_us aligned to the Unix epoch: [w, w + period) with
-- w = now - now % period. Capacity per window is burst (which defaults to limit). Up to
-- 2 * burst can pass across a window boundary; choose a sliding algorithm when that matters.
-- A pure step, spliced into the driver (lua/common.lua): reads stored (its state from byte
-- sat on), now, cost, limit, period, burst; sets ok, rem, re, rs and state (nil: nothing to
-- write).
  -- 1. The current window: the one of now, or the stored one when it starts after now by at most
  --    MAX_SKEW µs (`Clock::MAX_SKEW`, src/clock.rs): another instance's clock runs ahead of this
  --    one (skew), so the step decides in that window (nothing starts over, nothing goes
  --    backwards) and its times still count from this caller's now. A window further ahead is
  --    one of a clock that stepped back: an empty window here.
  local MAX_SKEW, t = 5000000, now
  local tag, w, c
  if stored and #stored == sat + 16 then
    tag, w, c = sunpack('<Bdd', stored, sat)
    if tag == 102 and w > now and w - now <= MAX_SKEW and w % period == 0 then
      t = w
    end
  end
  local start = t - t % period
  local stop = start + period

  -- 2. Read the count. A missing or corrupt state, or one of another window (an earlier one,
  --    or a later one after the clock stepped back), is an empty window. Capped to the quota.
  local n = 0
  if tag == 102 and w == start and c >= 0 and c < MAX_EXACT then
    n = c - c % 1 -- floor, without a call into math (see lua/common.lua)
    if n > burst then
      n = burst
    end
  end

  -- 3. Decide: add the cost only when it fits. A denied request consumes nothing. A denied
  --    request fits in the next window; a cost above the capacity never does.
  local allowed = n + cost <= burst
  local retry = 0
  if allowed then
    n = n + cost
  elseif cost > burst then
    retry = -1
  else
    retry = stop - now
  end

  -- 4. Reset: the window's end, unless it is empty (the key expires then).
  local reset = 0
  if n > 0 then
    reset = stop - now
  end

  -- 5. The new state: only an admission that costs changes it.
  ok, rem, re, rs = allowed, burst - n, retry, reset
  if allowed and cost > 0 then
    state = spack('<Bdd', 102, start, n)
  end
-- @refund
-- A refund, spliced into lua/refund.lua: reads state (this tier's, of this tag and length),
-- units, start, period, burst; sets new (nil: unchanged). Count - units, at least 0, only when
-- the stored window is the one the units were reserved in (another never got them).
      local _, a, b = sunpack('<Bdd', state)
      if a >= 0 and b >= 0 and a < MAX_EXACT and b < MAX_EXACT and a == start then
        new = spack('<Bdd', 102, a, math.max(b - units, 0))
      end
