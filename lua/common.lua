-- redlimit: the driver. One script holds it and every algorithm's step; Rust appends the steps
-- (`lua/<algorithm>.lua`, each a chunk returning its step function) and `return run(step_for)`.
--
-- KEYS  one state key per tier (all sharing one hash tag)
-- ARGV  1 now_us ('' = Redis server TIME), 2 cost (0 = peek), 3 tier count n,
--       then per tier i (from 4 + 4 * (i - 1)): algorithm name, limit, period_us, burst.
--       Numbers are non-negative integers below 2^53 (limit, period and burst at least 1).
-- Reply {allowed 0|1, limit, remaining, retry_after_ms (-1 = never), reset_after_ms, suspended 0|1}
--       of the binding tier: the request is admitted only when every tier admits it, and then
--       costs every tier (all or none).
--
-- A step is pure: step(stored, now, cost, limit, period, burst) returns
--   allowed, remaining, retry_us (-1 = never), reset_us, new_state
-- where stored is the key's string (nil/false when absent or not a string) and new_state the
-- string to store (nil: nothing to write). The driver reads every key with one MGET (which
-- answers nil for a key of another type: self-healing without pcall), writes each new state
-- with one `SET key state PX ttl`, the TTL being when the tier is fresh again, and only when
-- the state's own decision is the call's (a denial writes only a step's repair of a clock that
-- stepped back). The sliding log keeps a sorted set instead: its step reads it and returns a
-- function that writes it (called with the TTL).
--
-- State strings start with one tag byte naming the algorithm and the layout version, followed
-- by little-endian doubles (struct.pack): exact, and anything else reads as a fresh key.
-- Lua numbers are doubles: every value stays an exact integer below 2^53 (GCRA's debt aside),
-- and every time leaves in whole milliseconds rounded up (never tell a client to come back
-- early).

local MAX_EXACT = 9007199254740992 -- 2^53
-- The longest time a reply carries: 2^62 ms keeps its integers inside an i64.
local MAX_REPLY_MS = 4611686018427387904
local floor, ceil, min, max = math.floor, math.ceil, math.min, math.max
local spack, sunpack, call = struct.pack, struct.unpack, redis.call

-- ARGV[i] as an integer in [lo, 2^53), or nil (NaN fails every comparison).
local function int_arg(i, lo)
  local v = tonumber(ARGV[i])
  if v and v >= lo and v < MAX_EXACT and v == floor(v) then
    return v
  end
end

-- A stored number, or nil when corrupt, negative or beyond exact range (NaN included).
local function sane(v)
  return v >= 0 and v < MAX_EXACT
end

local function invalid_args()
  return redis.error_reply('ERR redlimit: invalid arguments; expected now_us|"", cost, tiers, ' ..
    'then algorithm, limit, period_us, burst per tier, one key per tier')
end

-- Microseconds until a key is fresh again to its TTL in ms: at least 1, at most 2^53 (Lua
-- writes numbers from 1e17 up as "1e+17", which PX refuses).
local function ttl_ms(reset_us)
  return min(max(1, ceil(reset_us / 1000)), MAX_EXACT)
end

local function write(key, state, reset_us)
  if type(state) == 'string' then
    call('SET', key, state, 'PX', ttl_ms(reset_us))
  else
    state(ttl_ms(reset_us))
  end
end

local function run(step_for)
  local now = ARGV[1]
  if now == '' then
    local t = call('TIME')
    now = t[1] * 1000000 + t[2]
  else
    now = int_arg(1, 0)
  end
  local cost, tiers = int_arg(2, 0), int_arg(3, 1)
  if not (now and cost and tiers) or #KEYS ~= tiers or #ARGV ~= 3 + 4 * tiers then
    return invalid_args()
  end
  local values
  if tiers == 1 then
    values = call('MGET', KEYS[1])
  else
    values = call('MGET', unpack(KEYS))
  end

  -- Decide every tier; the binding one is the least remaining if all admit, else the longest
  -- wait among those that deny ("never" first).
  local allowed, limit, remaining, retry, reset, state1, ok1, reset1
  local more -- tiers 2..n: {key, state, ok, reset}
  for i = 1, tiers do
    local j = 4 * i
    local step = step_for(ARGV[j])
    local l, period, burst = int_arg(j + 1, 1), int_arg(j + 2, 1), int_arg(j + 3, 1)
    if not (step and l and period and burst) then
      return invalid_args()
    end
    local ok, rem, re, rs, state = step(values[i], now, cost, l, period, burst, KEYS[i])
    if i == 1 then
      allowed, limit, remaining, retry, reset, state1, ok1, reset1 = ok, l, rem, re, rs, state, ok, rs
    else
      if rem < remaining then
        limit, remaining = l, rem
      end
      if not ok then
        if re < 0 or retry < 0 then
          retry = -1
        else
          retry = max(retry, re)
        end
      end
      allowed = allowed and ok
      reset = max(reset, rs)
      if state then
        more = more or {}
        more[#more + 1] = { KEYS[i], state, ok, rs }
      end
    end
  end

  -- Write: on admission every new state; on a denial only the repairs of denying tiers.
  if state1 and ok1 == allowed then
    write(KEYS[1], state1, reset1)
  end
  if more then
    for i = 1, #more do
      local m = more[i]
      if m[3] == allowed then
        write(m[1], m[2], m[4])
      end
    end
  end
  if retry > 0 then
    retry = min(ceil(retry / 1000), MAX_REPLY_MS)
  end
  return { allowed and 1 or 0, limit, remaining, retry, min(ceil(reset / 1000), MAX_REPLY_MS), 0 }
end
