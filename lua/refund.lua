-- redlimit: a refund. Gives `units` back to every tier of one route, atomically, never above a
-- tier's capacity: the units a request reserved and did not use (a settlement after its
-- response, a lease given back). The layouts of the strings are described in lua/common.lua.
--
-- KEYS  [1] the route's string (the sliding log: its controls' string `<key>#m`); [2] the
--       sliding log only: its sorted set; last, the tenant's string (`<prefix>:{<id>}#t`).
--       All share one hash tag.
-- ARGV  one string, packed little-endian: double now_us (-1 = Redis TIME; unused but
--       validated, so the argument shape matches a decision's), a byte naming the algorithm
--       (its state's tag), double units (from 1 below 2^53), then per tier (1 to 8) doubles
--       limit, period_us, burst: '<dBd' .. n * '<ddd', 17 + 24 * n bytes.
-- Reply the number of tiers that got units back (the sliding log: the entries removed).
--
-- The tiers in force are the route's override, else the tenant's, else the caller's, as in a
-- decision. States stored before a tenant's reset read as fresh (full): nothing to give back.
-- Per algorithm, a refund of u:
--   token bucket  tokens + u, at most burst (refill needs no accounting first: the next
--                 decision refills from the same ts and caps at burst either way)
--   gcra          debt - u, at least 0 (draining commutes with the subtraction the same way)
--   fixed window  count - u, at least 0 (a window that has passed reads as empty anyway)
--   sliding win.  current count - u, the rest from the previous window's, each at least 0
--   sliding log   the u newest entries removed (ZPOPMAX)
-- A state of another algorithm, or one that does not parse, is left as it is. The key keeps
-- its TTL: a refund never makes a state last longer than the admission that wrote it.

local MAX_EXACT = 9007199254740992
local sunpack, spack, byte, sub, call = struct.unpack, struct.pack, string.byte, string.sub,
  redis.call

local args = ARGV[1] or ''
local tiers = (#args - 17) / 24
if #ARGV ~= 1 or not KEYS[1] or tiers < 1 or tiers > 8 or tiers % 1 ~= 0 then
  return redis.error_reply('ERR redlimit: invalid refund arguments; expected the keys and ' ..
    'one argument packing now_us, algorithm, units, then limit, period_us, burst per tier')
end
local now, alg, units = sunpack('<dBd', args)
if not ((now == -1 or now >= 0 and now < MAX_EXACT and now % 1 == 0) and units >= 1 and
    units < MAX_EXACT and units % 1 == 0) then
  return redis.error_reply('ERR redlimit: invalid refund arguments; now_us and units must ' ..
    'be integers below 2^53 (units at least 1)')
end
local log = alg == 108
local skey, tkey = KEYS[1], KEYS[2]
if log then
  tkey = KEYS[3]
end
if not tkey then
  return redis.error_reply('ERR redlimit: invalid refund arguments; the tenant key is missing')
end

-- The quotas in force: `quotas` holds them from byte `qat` on (the caller's, after its header).
local quotas, qat = args, 18
local t = redis.pcall('GET', tkey)
local reset_us = 0
if t and not t.err and byte(t, 1) == 77 then
  local n = byte(t, 10)
  local clen = 10 + 24 * (n or 0)
  if n and n <= 8 and #t >= clen then
    if n > 0 then
      quotas, qat, tiers = t, 11, n
    end
    if #t >= clen + 8 then
      reset_us = sunpack('<d', t, clen + 1)
    end
  end
end
local s = redis.pcall('GET', skey)
if s and s.err then
  s = false
end
local at, stamp = 1, 0
if s and #s ~= 17 and #s ~= 25 and byte(s, 1) == 77 then
  local n = byte(s, 10)
  local clen = 10 + 24 * (n or 0)
  if not (n and n <= 8 and #s >= clen) then
    return 0
  end
  if n > 0 then
    quotas, qat, tiers = s, 11, n
  end
  at = clen + 1
  if byte(s, at) == 69 and #s >= at + 8 then
    stamp = sunpack('<d', s, at + 1)
    at = at + 9
  end
end
if reset_us > 0 and stamp < reset_us then
  return 0 -- stored before the tenant's reset: fresh already
end

if log then
  local popped = redis.pcall('ZPOPMAX', KEYS[2], units)
  if type(popped) ~= 'table' then
    return 0
  end
  return #popped / 2
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
    local len = tag == 119 and 25 or 17
    local state = sub(s, at, at + len - 1)
    at, i = at + len, i + 1
    local burst = i <= tiers and sunpack('<d', quotas, qat + 24 * (i - 1) + 16)
    local new
    if #state == len and burst and tag == alg then
      if tag == 119 then
        local _, w, c, p = sunpack('<Bddd', state)
        if c >= 0 and p >= 0 and c < MAX_EXACT and p < MAX_EXACT then
          local take = math.min(c, units)
          new = spack('<Bddd', 119, w, c - take, math.max(p - (units - take), 0))
        end
      else
        local _, a, b = sunpack('<Bdd', state)
        if a >= 0 and b >= 0 and a < MAX_EXACT and b < MAX_EXACT then
          if tag == 116 then
            new = spack('<Bdd', 116, math.min(a - a % 1 + units, burst), b)
          elseif tag == 103 then
            new = spack('<Bdd', 103, a, math.max(b - units, 0))
          elseif tag == 102 then
            new = spack('<Bdd', 102, a, math.max(b - units, 0))
          end
        end
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
    call('SET', skey, out, 'PX', pttl)
  else
    call('SET', skey, out)
  end
end
return changed
