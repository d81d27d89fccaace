-- redlimit: the driver. One script holds it and every algorithm's step: Rust splices the steps
-- (`lua/<algorithm>.lua`) in at the `@steps` line below, each as a branch
-- `elseif alg == <tag byte> then <step>`.
--
-- KEYS  one state key per tier (all sharing one hash tag)
-- ARGV  one string, packed little-endian (struct.pack): doubles now_us (-1 = Redis server
--       TIME) and cost (0 = peek), then per tier a byte naming the algorithm (its state's tag:
--       't' token bucket, 'g' GCRA, 'f' fixed window, 'w' sliding window, 'l' sliding log) and
--       doubles limit, period_us, burst: '<dd' .. n * '<Bddd', 16 + 25 * n bytes. Numbers are
--       integers below 2^53 (limit, period and burst at least 1). Packed, because every ARGV
--       element and every tonumber costs Redis more than the whole unpack.
-- Reply one string, packed '<Bdddd': flags (1 allowed, 2 suspended), limit, remaining,
--       retry_after_ms (-1 = never), reset_after_ms, of the binding tier: the request is
--       admitted only when every tier admits it, and then costs every tier (all or none). One
--       string costs Redis less than converting an array of integers.
--
-- A step is pure: it reads `stored` (the key's string; false when absent, not a string when the
-- key holds another type), `now`, `cost`, `limit`, `period`, `burst` (and `key`), and sets
--   ok (allowed), rem (remaining), re (retry µs, -1 = never), rs (reset µs), state
-- where state is the string to store, or nil when nothing is to be written. The driver reads
-- every key with one MGET (which answers nil for a key of another type: self-healing without
-- pcall, which would also swallow a NOPERM), and writes
-- each new state with one `SET key state PX ttl`, the TTL being when the tier is fresh again,
-- only when the state's own decision is the call's (a denial writes only a step's repair of a
-- clock that stepped back). The sliding log keeps a sorted set instead: its step reads it, and
-- its state is a function that writes it, called with the TTL.
--
-- State strings start with one tag byte naming the algorithm and the layout version, followed
-- by little-endian doubles (struct.pack): exact, and anything else reads as a fresh key.
-- Lua numbers are doubles: every value stays an exact integer below 2^53 (GCRA's debt aside),
-- and every time leaves in whole milliseconds rounded up (never tell a client to come back
-- early). Redis runs the script's body on every call: the steps are spliced in rather than
-- called, and the hot path makes no closure and no table of its own.

local MAX_EXACT = 9007199254740992 -- 2^53
-- The longest time a reply carries: 2^62 ms keeps its integers inside an i64.
local MAX_REPLY_MS = 4611686018427387904
local floor, ceil, min, max = math.floor, math.ceil, math.min, math.max
local spack, sunpack, call = struct.pack, struct.unpack, redis.call

local args, tiers = ARGV[1], #KEYS
if #ARGV ~= 1 or tiers < 1 or #args ~= 16 + 25 * tiers then
  return redis.error_reply('ERR redlimit: invalid arguments; expected one key per tier and ' ..
    'one argument packing now_us, cost, then algorithm, limit, period_us, burst per tier')
end
local now, cost, alg, limit, period, burst, pos = sunpack('<ddBddd', args)
if not (cost >= 0 and cost < MAX_EXACT and cost % 1 == 0 and
    (now == -1 or now >= 0 and now < MAX_EXACT and now % 1 == 0)) then
  return redis.error_reply('ERR redlimit: invalid arguments; now_us and cost must be ' ..
    'integers from 0 below 2^53 (now_us -1 for the server clock)')
end
if now == -1 then
  local t = call('TIME')
  now = t[1] * 1000000 + t[2]
end
local values, stored
if tiers == 1 then
  -- The sliding log reads its own sorted set.
  if alg ~= 108 then
    stored = call('MGET', KEYS[1])[1]
  end
else
  values = call('MGET', unpack(KEYS))
  stored = values[1]
end

-- Decide every tier; the binding one is the least remaining if all admit, else the longest
-- wait among those that deny ("never" first).
local all_ok, bind_limit, bind_rem, bind_re, max_rs, state1, ok1, rs1
local more -- tiers 2..n: {key, state, ok, reset}
local i = 1
while true do
  if not (limit >= 1 and limit < MAX_EXACT and limit % 1 == 0 and period >= 1 and
      period < MAX_EXACT and period % 1 == 0 and burst >= 1 and burst < MAX_EXACT and
      burst % 1 == 0) then
    return redis.error_reply('ERR redlimit: invalid arguments; limit, period_us and burst ' ..
      'must be integers from 1 below 2^53')
  end
  local key = KEYS[i]
  local ok, rem, re, rs, state
  if false then
  -- @steps
  else
    return redis.error_reply('ERR redlimit: unknown algorithm')
  end
  if i == 1 then
    all_ok, bind_limit, bind_rem, bind_re, max_rs, state1, ok1, rs1 =
      ok, limit, rem, re, rs, state, ok, rs
  else
    if rem < bind_rem then
      bind_limit, bind_rem = limit, rem
    end
    if not ok then
      if re < 0 or bind_re < 0 then
        bind_re = -1
      else
        bind_re = max(bind_re, re)
      end
    end
    all_ok = all_ok and ok
    max_rs = max(max_rs, rs)
    if state then
      more = more or {}
      more[#more + 1] = { key, state, ok, rs }
    end
  end
  if i == tiers then
    break
  end
  i = i + 1
  alg, limit, period, burst, pos = sunpack('<Bddd', args, pos)
  stored = values[i]
end

-- Write: on admission every new state; on a denial only the repairs of denying tiers. The TTL:
-- when the tier is fresh again, at least 1 ms, at most 2^53 ms (Lua writes numbers from 1e17 up
-- as "1e+17", which PX refuses). On the hot path `x - x % 1` is floor(x) (exact) and
-- comparisons stand in for min and max: a call into math costs Redis more than the arithmetic.
if state1 and ok1 == all_ok then
  local ttl = rs1 / 1000
  local frac = ttl % 1
  ttl = ttl - frac
  if frac > 0 then
    ttl = ttl + 1
  end
  if ttl < 1 then
    ttl = 1
  elseif ttl > MAX_EXACT then
    ttl = MAX_EXACT
  end
  if type(state1) == 'string' then
    call('SET', KEYS[1], state1, 'PX', ttl)
  else
    state1(ttl)
  end
end
if more then
  for i = 1, #more do
    local m = more[i]
    if m[3] == all_ok then
      local ttl = min(max(1, ceil(m[4] / 1000)), MAX_EXACT)
      if type(m[2]) == 'string' then
        call('SET', m[1], m[2], 'PX', ttl)
      else
        m[2](ttl)
      end
    end
  end
end
if bind_re > 0 then
  bind_re = min(ceil(bind_re / 1000), MAX_REPLY_MS)
end
max_rs = max_rs / 1000
local frac = max_rs % 1
max_rs = max_rs - frac
if frac > 0 then
  max_rs = max_rs + 1
end
if max_rs > MAX_REPLY_MS then
  max_rs = MAX_REPLY_MS
end
return spack('<Bdddd', all_ok and 1 or 0, bind_limit, bind_rem, bind_re, max_rs)
