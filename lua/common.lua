-- redlimit: shared preamble, prepended to every algorithm script.
--
-- Every script takes the same ARGV and answers with the same reply:
--   ARGV  1 now_us ('' = use Redis server TIME), 2 cost (0 = peek), 3 limit,
--         4 period_us, 5 burst — all non-negative integers below 2^53
--   reply {allowed 0|1, limit, remaining, retry_after_ms (-1 = never), reset_after_ms, suspended 0|1}
-- Lua numbers are doubles: every value is kept an exact integer below 2^53, and every time
-- leaves the script in whole milliseconds rounded up (never tell a client to come back early).

local MAX_EXACT = 9007199254740992 -- 2^53

-- ARGV[i] as an integer in [min, 2^53), or nil.
local function int_arg(i, min)
  local v = tonumber(ARGV[i])
  if v == nil or v ~= v or v < min or v >= MAX_EXACT or v ~= math.floor(v) then
    return nil
  end
  return v
end

-- now, cost, limit, period, burst; nil when an argument is malformed.
local function parse_args()
  local now
  if ARGV[1] == '' then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  else
    now = int_arg(1, 0)
  end
  local cost, limit, period, burst = int_arg(2, 0), int_arg(3, 1), int_arg(4, 1), int_arg(5, 1)
  if not (now and cost and limit and period and burst) then
    return nil
  end
  return now, cost, limit, period, burst
end

-- The error for malformed arguments: never echoes the key.
local function invalid_args()
  return redis.error_reply('ERR redlimit: invalid arguments; expected now_us|"", cost, limit, period_us, burst as integers')
end

-- HMGET that treats a key of the wrong type as absent (and deletes it): self-healing.
local function read_fields(key, ...)
  local values = redis.pcall('HMGET', key, ...)
  if type(values) ~= 'table' or values.err then
    redis.call('DEL', key)
    return {}
  end
  return values
end

-- A stored number, or nil when missing, corrupt, negative or beyond exact range.
local function stored_number(v)
  local n = tonumber(v)
  if n == nil or n ~= n or n < 0 or n >= MAX_EXACT then
    return nil
  end
  return n
end

-- Microseconds to whole milliseconds, rounded up.
local function ms_up(us)
  return math.ceil(us / 1000)
end

-- The longest time a reply carries: 2^62 ms keeps its integers inside an i64. Only absurd
-- quotas (a burst taking 146 million years to refill) come near it.
local MAX_REPLY_MS = 4611686018427387904

-- The reply every algorithm sends.
local function reply(allowed, limit, remaining, retry_us, reset_us)
  local retry_ms = -1
  if retry_us >= 0 then
    retry_ms = math.min(ms_up(retry_us), MAX_REPLY_MS)
  end
  return { allowed and 1 or 0, limit, remaining, retry_ms, math.min(ms_up(reset_us), MAX_REPLY_MS), 0 }
end

-- PEXPIRE `key` when its state is back to fresh, `reset_us` from now: at least 1 ms, at most
-- 2^53 ms (285 000 years), because Lua writes numbers from 1e17 up as "1e+17", which PEXPIRE
-- refuses.
local function expire(key, reset_us)
  redis.call('PEXPIRE', key, math.min(math.max(1, ms_up(reset_us)), MAX_EXACT))
end
