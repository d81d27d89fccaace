-- Token bucket (the default algorithm): capacity burst, refilled at limit per period_us on
-- demand. State 't' + doubles tokens (whole tokens in the bucket), ts (µs time up to which
-- refill is accounted). Fractional progress is kept: ts advances only by the time the whole
-- tokens took to arrive.
-- A pure step, spliced into the driver (lua/common.lua): reads stored (its state from byte
-- sat on), now, cost, limit, period, burst; sets ok, rem, re, rs and state (nil: nothing to
-- write).
  -- 1. Read the state: a missing or corrupt bucket is a full one.
  local tokens, ts = burst, now
  if stored and #stored == sat + 16 then
    local tag, a, b = sunpack('<Bdd', stored, sat)
    if tag == 116 and a >= 0 and a < MAX_EXACT and b >= 0 and b < MAX_EXACT then
      tokens, ts = a, b
    end
  end

  -- 2. Cap to the current quota and clock, so a tightened quota or a clock stepped back never
  --    locks a key out. A ts ahead of now is another instance's clock running ahead of this one
  --    (skew) when it is at most MAX_SKEW µs ahead (`Clock::MAX_SKEW`, src/clock.rs): the step
  --    decides as of ts (`t`), so nothing is refilled and nothing goes backwards, and its times
  --    still count from this caller's now. Further ahead, this clock stepped back: ts moves to
  --    now, written even on a denial, or each call would move it again and the bucket would not
  --    refill until the clock caught up.
  tokens = tokens - tokens % 1 -- floor, without a call into math (see lua/common.lua)
  if tokens > burst then
    tokens = burst
  end
  local MAX_SKEW, t = 5000000, now
  local stepped_back = ts - now > MAX_SKEW
  if stepped_back then
    ts = now
  elseif ts > now then
    t = ts
  end
  -- The bucket as stored (capped): a denial writes nothing, so its times count from here.
  -- Counting them from the refilled bucket would round twice (ceil(a) + ceil(b) > ceil(a + b))
  -- and tell a client up to 1 µs (so 1 ms) too late.
  local tokens0, ts0 = tokens, ts

  -- 3. Refill up to t. Past full the clock stops: progress beyond capacity is discarded.
  local elapsed = t - ts
  -- (elapsed is whole: elapsed >= x is elapsed >= ceil(x), saving the call)
  if elapsed >= (burst - tokens) * period / limit then
    tokens, ts = burst, t
  elseif elapsed > 0 then
    local gained = elapsed * limit / period
    gained = gained - gained % 1
    -- Past 2^53 the division can land one token off. Settle on the count the retry times
    -- promise: the most n whose arrival time, ceil(n * period / limit), has passed (elapsed is
    -- whole: ceil(x) <= elapsed is x <= elapsed).
    if (gained + 1) * period / limit <= elapsed then
      gained = gained + 1
    elseif gained > 0 and gained * period / limit > elapsed then
      gained = gained - 1
    end
    if gained > 0 then
      tokens = tokens + gained
      local took = gained * period / limit
      local frac = took % 1 -- ceil, as in step 5b
      took = took - frac
      if frac > 0 then
        took = took + 1
      end
      ts = ts + took
      if ts > t then
        ts = t
      end
    end
  end

  -- 4. Decide. A denied request consumes nothing.
  local allowed = cost <= tokens
  local retry = 0
  if allowed then
    tokens = tokens - cost
  elseif cost > burst then
    retry = -1
  else
    -- 5a. Until `cost` tokens are there.
    retry = ts0 + math.ceil((cost - tokens0) * period / limit) - now
  end

  -- 5b. Until the bucket is full again (the key expires then).
  local reset, full_tokens, full_ts = 0, tokens, ts
  if not allowed then
    full_tokens, full_ts = tokens0, ts0
  end
  if tokens < burst then
    reset = (burst - full_tokens) * period / limit
    local frac = reset % 1 -- ceil, without a call into math
    reset = full_ts + reset - frac - now
    if frac > 0 then
      reset = reset + 1
    end
  end

  -- 6. The new state: only what changed (an admission that costs, or a repaired clock).
  ok, rem, re, rs = allowed, tokens, retry, reset
  if cost > 0 and (allowed or stepped_back) then
    state = spack('<Bdd', 116, tokens, ts)
  end
-- @refund
-- A refund, spliced into lua/refund.lua: reads state (this tier's, of this tag and length),
-- units, start, period, burst; sets new (nil: unchanged). Whole tokens + units, at most burst
-- (refill needs no accounting first: the next decision refills from the same ts and caps at
-- burst either way).
      local _, a, b = sunpack('<Bdd', state)
      if a >= 0 and b >= 0 and a < MAX_EXACT and b < MAX_EXACT then
        new = spack('<Bdd', 116, math.min(a - a % 1 + units, burst), b)
      end
