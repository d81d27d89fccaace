-- redlimit: a refund. Gives `units` back to every tier of one route, atomically, never above a
-- tier's capacity, and only to the window they were reserved in: the units a request reserved
-- and did not use (a settlement after its response, a lease given back). The layouts of the
-- strings are described in lua/common.lua.
--
-- KEYS  [1] the route's string (the sliding log: its controls' string `<key>#m`); [2] the
--       sliding log only: its sorted set; last, the tenant's string (`<prefix>:{<id>}#t`).
--       All share one hash tag.
-- ARGV  one string, packed little-endian: double now_us (-1 = Redis TIME; -2: see `reserved`),
--       a byte naming the algorithm (its state's tag), doubles units (from 1 below 2^53) and
--       age_us, then per tier (1 to 8) doubles limit, period_us, burst: '<dBdd' .. n * '<ddd',
--       25 + 24 * n bytes. `reserved` is when the units were reserved: `now_us - age_us`, the
--       caller's client time of the reservation (age 0); with now_us -2, age_us itself: the
--       reservation's time on Redis's clock, as its admission replied it (lua/common.lua,
--       Reply), less the caller's margin; with -1 (Redis time, the admission's time unknown),
--       TIME less the µs the caller's monotonic clock measured since before it sent the
--       reservation's call, never later than the reservation's true time when Redis runs the
--       refund at once, later by the time a refund waits in Redis (a busy or stalled server).
-- Reply the number of tiers that got units back (the sliding log: the entries removed).
--
-- The tiers in force are the route's override, else the tenant's, else the caller's, as in a
-- decision. Nothing is given back when `reserved` is before the tenant's reset (the units were
-- paid for in state the reset forgot; with a client clock, within MAX_SKEW after it, since the
-- reset's clock may be that far behind the reservation's), nor to states stored before it
-- (fresh: full).
-- Per algorithm, a refund of u reserved at `reserved` is the part of its step file after its
-- `@refund` line (`lua/<algorithm>.lua`), spliced in below at the `@refunds` line as a branch
-- `elseif alg == <tag byte> then <refund>`; the sliding log's is here: the u oldest entries
-- scored at or after `reserved` removed (its own entries are among them; an older one removed
-- in their place leaves the log counting a newer unit, never fewer units in any window to
-- come).
-- An estimate of `reserved` earlier than the truth can only lose a refund (a reservation made
-- within that error after a window starts or after a reset gives nothing back), never give one
-- to the wrong window. A state of another algorithm, or one that does not parse, is left as it
-- is. The key keeps its TTL: a refund never makes a state last longer than the admission that
-- wrote it.

-- Names in capitals (MAX_EXACT, CONTROLS, STATE_LEN, ...) are the numbers every script shares:
-- Rust writes each one's value in as a literal when it assembles the script (`CONSTANTS` in
-- src/store/wire/scripts.rs), so they have one source and no call pays for a local.
local sunpack, spack, byte, sub, call = struct.unpack, struct.pack, string.byte, string.sub,
  redis.call

local args = ARGV[1] or ''
local tiers = (#args - 25) / QUOTA_BYTES
if #ARGV ~= 1 or not KEYS[1] or tiers < 1 or tiers > MAX_TIERS or tiers % 1 ~= 0 then
  return redis.error_reply('ERR redlimit: invalid refund arguments; expected the keys and ' ..
    'one argument packing now_us, algorithm, units, age_us, then limit, period_us, burst ' ..
    'per tier')
end
local now, alg, units, age = sunpack('<dBdd', args)
if not ((now == -1 or now == -2 or now >= 0 and now < MAX_EXACT and now % 1 == 0) and
    units >= 1 and units < MAX_EXACT and units % 1 == 0 and age >= 0 and age < MAX_EXACT and
    age % 1 == 0) then
  return redis.error_reply('ERR redlimit: invalid refund arguments; now_us, units and age_us ' ..
    'must be integers below 2^53 (units at least 1)')
end
-- A client clock's reservation is compared with a reset made under another client's clock,
-- which may be up to MAX_SKEW µs (`Clock::MAX_SKEW`) behind it: one within that of the reset
-- may have been made before it, so it gives nothing back. Redis time has no skew.
local skew = 5000000
if now == -2 then
  skew, now, age = 0, age, 0 -- the reservation's time on Redis's clock, sent as age_us
elseif now == -1 then
  skew = 0
  local t = call('TIME')
  now = t[1] * 1000000 + t[2]
end
local reserved = now - age
local log = alg == LOG_TAG
local skey, tkey = KEYS[1], KEYS[2]
if log then
  tkey = KEYS[3]
end
if not tkey then
  return redis.error_reply('ERR redlimit: invalid refund arguments; the tenant key is missing')
end

-- The quotas in force: `quotas` holds them from byte `qat` on (the caller's, after its header).
local quotas, qat = args, 26
local t = redis.pcall('GET', tkey)
local reset_us = 0
if t and not t.err then
  local n, clen, until_us
  -- @controls t -> n, clen, until_us
  if clen and clen > 0 then
    if n > 0 then
      quotas, qat, tiers = t, CONTROLS_HEAD + 1, n
    end
    if #t >= clen + 8 then
      reset_us = sunpack('<d', t, clen + 1)
      if not (reset_us >= 0 and reset_us < MAX_EXACT) then
        reset_us = 0
      end
    end
  end
end
local s = redis.pcall('GET', skey)
if s and s.err then
  s = false
end
local at, stamp = 1, 0
if s and #s ~= STATE_LEN and #s ~= WIDE_STATE_LEN then
  local n, clen, until_us
  -- @controls s -> n, clen, until_us, stamp, at
  if not clen then
    return 0
  end
  if clen > 0 and n > 0 then
    quotas, qat, tiers = s, CONTROLS_HEAD + 1, n
  end
end
if reset_us > 0 and (stamp < reset_us or reserved < reset_us + skew) then
  return 0 -- stored before the tenant's reset (fresh already), or reserved before it
end

if log then
  -- The oldest `units` entries scored from the reservation on, removed 1000 at a time (an
  -- unpack of more could overflow Lua's stack).
  local from = string.format('%d', reserved)
  local gone = 0
  while gone < units do
    local n = math.min(units - gone, 1000)
    local oldest = redis.pcall('ZRANGEBYSCORE', KEYS[2], from, '+inf', 'LIMIT', 0, n)
    if type(oldest) ~= 'table' or #oldest == 0 then
      break
    end
    call('ZREM', KEYS[2], unpack(oldest))
    gone = gone + #oldest
    if #oldest < n then
      break
    end
  end
  return gone
end
if not s then
  return 0
end

local out, changed, i = sub(s, 1, at - 1), 0, 0
while at <= #s do
  local tag = byte(s, at)
  if tag == 0 then
    out, at, i = out .. '\0', at + 1, i + 1
  else
    local len = tag == WIDE_TAG and WIDE_STATE_LEN or STATE_LEN
    local state = sub(s, at, at + len - 1)
    at, i = at + len, i + 1
    local period, burst
    if i <= tiers then
      period, burst = sunpack('<dd', quotas, qat + QUOTA_BYTES * (i - 1) + 8)
    end
    local new
    if #state == len and burst and tag == alg then
      -- The start of the fixed window the units were reserved in.
      local start = reserved - reserved % period
      if false then
      -- @refunds
      end
    end
    if new and new ~= state then
      out, changed = out .. new, changed + 1
    else
      out = out .. state
    end
  end
end
if changed > 0 then
  local pttl = call('PTTL', skey)
  if pttl > 0 then
    -- As an integer (see lua/common.lua's write).
    call('SET', skey, out, 'PX', string.format('%d', pttl))
  else
    call('SET', skey, out)
  end
end
return changed
