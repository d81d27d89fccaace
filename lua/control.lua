-- redlimit: fleet controls of one limiter key (set_quota, clear_quota, suspend, resume, reset,
-- inspect), atomic like a decision. The layout of the string at KEYS[1] is described in
-- lua/common.lua: optional controls ('M', double suspended_until_us, byte n, n * doubles limit,
-- period_us, burst), then the tiers' states.
--
-- KEYS  [1] the limiter key's string; [2] the sliding log's sorted set, when the limiter's
--       algorithm is the sliding log (reset deletes it, inspect counts it).
-- ARGV  one string, packed little-endian: double now_us (-1 = Redis TIME), a byte naming the
--       operation, then its operand:
--         'q' set quota: a byte n (1 to 8), then n * doubles limit, period_us, burst
--         'c' clear quota   's' suspend: double duration_us   'r' resume
--         'x' reset (forget the tiers' states)   'i' inspect (change nothing)
-- Reply {the string after the operation or false, its PTTL in ms, now_us as a string,
--        the sorted set's size or -1}.

local MAX_EXACT = 9007199254740992
local OVERRIDE_IDLE_MS = 2592000000
local sunpack, spack, byte, sub, call = struct.unpack, struct.pack, string.byte, string.sub,
  redis.call

local function invalid(what)
  return redis.error_reply('ERR redlimit: invalid control arguments; ' .. what)
end

local args = ARGV[1] or ''
if #ARGV ~= 1 or #KEYS < 1 or #args < 9 then
  return invalid('expected one key and one packed argument')
end
local now, op, pos = sunpack('<dB', args)
if not (now == -1 or now >= 0 and now < MAX_EXACT and now % 1 == 0) then
  return invalid('now_us must be an integer from 0 below 2^53, or -1')
end
if now == -1 then
  local t = call('TIME')
  now = t[1] * 1000000 + t[2]
end

local key = KEYS[1]
-- A key of another type reads as absent, as in the decision script; any other error is the
-- caller's.
local s = redis.pcall('GET', key)
if s and s.err then
  if sub(s.err, 1, 9) ~= 'WRONGTYPE' then
    return s
  end
  s = false
end
local pttl = call('PTTL', key)

-- Split the string into its controls and its states.
local until_us, override, states = 0, '\0', ''
if s then
  if byte(s, 1) == 77 then
    local n = byte(s, 10)
    local len = 10 + 24 * (n or 0)
    if n and n <= 8 and #s >= len then
      until_us = sunpack('<d', s, 2)
      override = sub(s, 10, len)
      states = sub(s, len + 1)
    end
  else
    states = s
  end
end

if op == 105 then -- 'i'
elseif op == 113 then -- 'q'
  local n = byte(args, pos)
  if not n or n < 1 or n > 8 or #args ~= pos + 24 * n then
    return invalid('set quota takes 1 to 8 quotas')
  end
  for i = 0, n - 1 do
    local limit, period, burst = sunpack('<ddd', args, pos + 1 + 24 * i)
    if not (limit >= 1 and limit < MAX_EXACT and limit % 1 == 0 and period >= 1 and
        period < MAX_EXACT and period % 1 == 0 and burst >= 1 and burst < MAX_EXACT and
        burst % 1 == 0) then
      return invalid('limit, period_us and burst must be integers from 1 below 2^53')
    end
  end
  override = sub(args, pos)
elseif op == 99 then -- 'c'
  override = '\0'
elseif op == 115 then -- 's'
  local duration = #args == pos + 7 and sunpack('<d', args, pos)
  if not (duration and duration >= 1 and duration < MAX_EXACT and duration % 1 == 0) then
    return invalid('the suspension must be an integer of µs from 1 below 2^53')
  end
  until_us = now + duration
elseif op == 114 then -- 'r'
  until_us = 0
elseif op == 120 then -- 'x'
  states = ''
  if KEYS[2] then
    call('DEL', KEYS[2])
  end
else
  return invalid('unknown operation')
end

if op ~= 105 then
  local suspended = until_us > now
  local has_override = override ~= '\0'
  local new = states
  if suspended or has_override then
    new = 'M' .. spack('<d', suspended and until_us or 0) .. override .. states
  end
  if new == '' then
    call('DEL', key)
  else
    -- Keep the states for as long as they were to live; the controls for as long as they last.
    local ttl = 1
    if states ~= '' and pttl > 0 then
      ttl = pttl
    end
    if has_override and ttl < OVERRIDE_IDLE_MS then
      ttl = OVERRIDE_IDLE_MS
    end
    if suspended then
      local left = math.ceil((until_us - now) / 1000)
      if ttl < left then
        ttl = left
      end
    end
    call('SET', key, new, 'PX', ttl)
  end
  s = new ~= '' and new
end

local count = -1
if KEYS[2] then
  local n = redis.pcall('ZCARD', KEYS[2])
  if type(n) == 'number' then
    count = n
  end
end
return { s, call('PTTL', key), string.format('%d', now), count }
