-- Token bucket (the default algorithm).
-- KEYS[1]  hash: tk = whole tokens in the bucket, ts = µs time up to which refill is accounted
-- Capacity is burst; tokens arrive at limit per period_us, refilled on demand.
-- Fractional progress is kept: ts advances only by the time the whole tokens took to arrive.
local now, cost, limit, period, burst = parse_args()
if not now then
  return invalid_args()
end
local key = KEYS[1]

-- 1. Read the state: a missing or corrupt bucket is a full one.
local stored = read_fields(key, 'tk', 'ts')
local tokens, ts = stored_number(stored[1]), stored_number(stored[2])
if tokens == nil or ts == nil then
  tokens, ts = burst, now
end

-- 2. Cap to the current quota and clock, so a tightened quota or a clock stepped back never
--    locks a key out. A clock stepped back moves ts to now; that move is written even on a
--    denial, or each call would move it again and the bucket would not refill until the clock
--    caught up.
tokens = math.min(math.floor(tokens), burst)
local stepped_back = ts > now
ts = math.min(ts, now)

-- 3. Refill. Past full the clock stops: progress beyond capacity is discarded.
local to_full = math.ceil((burst - tokens) * period / limit)
if now - ts >= to_full then
  tokens, ts = burst, now
else
  local elapsed = now - ts
  local gained = math.floor(elapsed * limit / period)
  -- Past 2^53 the division can land one token off. Settle on the count the retry times promise:
  -- the most n whose arrival time, ceil(n * period / limit), has passed.
  if math.ceil((gained + 1) * period / limit) <= elapsed then
    gained = gained + 1
  elseif gained > 0 and math.ceil(gained * period / limit) > elapsed then
    gained = gained - 1
  end
  tokens = tokens + gained
  ts = math.min(now, ts + math.ceil(gained * period / limit))
end

-- 4. Decide. A denied request consumes nothing.
local allowed = cost <= tokens
if allowed then
  tokens = tokens - cost
end

-- 5. Times: until `cost` tokens are there, and until the bucket is full again.
local retry = 0
if not allowed then
  if cost > burst then
    retry = -1
  else
    retry = ts + math.ceil((cost - tokens) * period / limit) - now
  end
end
local reset = 0
if tokens < burst then
  reset = ts + math.ceil((burst - tokens) * period / limit) - now
end

-- 6. Write only what changed; the key expires when it would be full anyway.
if cost > 0 and (allowed or stepped_back) then
  redis.call('HSET', key, 'tk', tokens, 'ts', ts)
  expire(key, reset)
end
return reply(allowed, limit, tokens, retry, reset)
