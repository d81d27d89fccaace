-- redlimit: fleet controls (set_quota, clear_quota, suspend, extend, resume, reset, inspect,
-- and learning's set and clear), atomic like a decision. The layouts of both strings, the
-- tenant's and a route's, are described in lua/common.lua.
--
-- KEYS  a tenant's control: [1] the tenant's key (`<prefix>:{<id>}#t`).
--       a route's control: [1] the route's string; [2] the sliding log's sorted set, when the
--       limiter's algorithm is the sliding log (reset deletes it, inspect counts it); then,
--       with 'q', 'c', 'a', 'u' and 'i': the route's learning record (`<key>#l`, built by
--       Rust); then, last, with 'a' only: the tenant's key (`<prefix>:{<id>}#t`).
-- The learning record (the route's key and `#l`, for every algorithm: no route, scope or
-- other derived key ends so) holds controls too: 'M', double the end of the learned quota's
-- time, then the override learning set, byte for byte as the route holds it. The route's
-- override is learned while the record holds the same bytes, an operator's otherwise. An
-- operator's 'q' and 'c' remove the record's override in the same call; 'a' never replaces an
-- operator's override, and under an override of every route in the tenant's controls (only
-- an operator sets one) sets nothing and clears the route's learned override, as 'u' does.
-- The decision script never reads the record, and this one only its override (the mark): the
-- end is read by Rust, bounded (no learning write sets one more than 30 days ahead; an end past
-- that or no time reads as over: src/limiter/control.rs).
-- ARGV  one string, packed little-endian: double now_us (-1 = Redis TIME), a byte naming the
--       operation, a byte naming the algorithm (its tag; 0 on the tenant's key), then its
--       operand:
--         'q' set quota: a byte n (1 to 8), then n * doubles limit, period_us, burst
--         'c' clear quota   'x' reset (forget the states; the tenant's: of every route)
--         'i' inspect (change nothing)
--         's' suspend: double duration_us (the end is now + duration)
--         'e' extend: double duration_us (the end is the later of its own and now + duration)
--         'r' resume
--         'a' learn: double time_us (how long the learned quota lasts), then as 'q'; sets the
--             route's override and its record, unless the route holds an operator's override
--             (then nothing changes) or the tenant's controls hold an override of every route
--             (then as 'u')
--         'u' unlearn: clears the route's override when it is learned, and the record
--       A suspension of the tenant's key reaches every route; one of a route's, that route.
-- Reply {the string after the operation or false, its PTTL in ms, now_us as a string,
--        the sorted set's size or -1, the learning record after the operation or false}.
-- A route's control on a key that holds another algorithm's state (or another type) is
-- refused with an error naming what the key holds, and changes nothing.

-- Names in capitals (MAX_EXACT, CONTROLS, STATE_LEN, ...) are the numbers every script shares:
-- Rust writes each one's value in as a literal when it assembles the script (`CONSTANTS` in
-- src/store/wire/scripts.rs), so they have one source and no call pays for a local.
local sunpack, spack, byte, sub, call = struct.unpack, struct.pack, string.byte, string.sub,
  redis.call
-- NAMES: every algorithm's name under its tag byte, written here by Rust from the algorithms'
-- specs (`local NAMES = { [116] = 'token-bucket', ... }`).
-- @names

local function invalid(what)
  return redis.error_reply('ERR redlimit: invalid control arguments; ' .. what)
end

local args = ARGV[1] or ''
if #ARGV ~= 1 or #KEYS < 1 or #args < 10 then
  return invalid('expected one key and one packed argument')
end
local now, op, alg, pos = sunpack('<dBB', args)
if not (now == -1 or now >= 0 and now < MAX_EXACT and now % 1 == 0) then
  return invalid('now_us must be an integer from 0 below 2^53, or -1')
end
local tenant = alg == 0
if not tenant and not NAMES[alg] then
  return invalid('unknown algorithm')
end
if now == -1 then
  local t = call('TIME')
  now = t[1] * 1000000 + t[2]
end

local function refused(what)
  local expected = tenant and 'a tenant\'s controls' or (NAMES[alg] .. ' state')
  return redis.error_reply('ERR redlimit: refused: the key holds ' .. what .. ', not ' ..
    expected .. '; nothing changed')
end

-- What a string of states holds when it is another algorithm's, or nil.
local function foreign(states)
  local at = 1
  while at <= #states do
    local tag = byte(states, at)
    if tag == 0 then
      at = at + 1
    elseif tag == STAMP then
      at = at + 9 -- the tenant's reset the states belong to
    else
      if tag ~= alg and NAMES[tag] then
        return NAMES[tag] .. ' state'
      end
      at = at + (tag == WIDE_TAG and WIDE_STATE_LEN or STATE_LEN)
    end
  end
  return nil
end

local key = KEYS[1]
-- The sliding log's sorted set, and the route's learning record.
local zkey = not tenant and alg == LOG_TAG and KEYS[2] or nil
local rkey, tkey = nil, nil
if not tenant and (op == 113 or op == 99 or op == 97 or op == 117 or op == 105) then
  rkey = KEYS[zkey and 3 or 2]
  if rkey and op == 97 then
    tkey = KEYS[zkey and 4 or 3]
    if not tkey then
      return invalid('learning takes the tenant\'s key after the record')
    end
  end
end
local s = redis.pcall('GET', key)
if s and s.err then
  if sub(s.err, 1, 9) ~= 'WRONGTYPE' then
    return s
  end
  -- Only an admitted decision may replace a key of another type; a control never does.
  if op ~= 105 then
    return refused('a ' .. call('TYPE', key).ok)
  end
  s = false
end
local pttl = call('PTTL', key)

-- Split the string into its controls and the rest: a route's states, or the tenant's reset.
local until_us, override, rest = 0, '\0', ''
if s then
  local n, len = 0, 0
  if #s ~= STATE_LEN and #s ~= WIDE_STATE_LEN then
    -- @controls s -> n, len, until_us
  end
  if len ~= 0 then
    -- Controls (a string that starts like them but is cut short keeps nothing).
    if len then
      override, rest = sub(s, CONTROLS_HEAD, len), sub(s, len + 1)
    end
  elseif not tenant then
    rest = s
  end
end
local reset_us = 0
if tenant and #rest >= 8 then
  reset_us = sunpack('<d', rest)
end

if not tenant and op ~= 105 then
  local what = foreign(rest)
  if not what and zkey then
    local kind = call('TYPE', zkey).ok
    if kind == 'string' then
      local other = byte(call('GET', zkey), 1)
      what = (NAMES[other] or 'unreadable') .. ' state'
    elseif kind ~= 'zset' and kind ~= 'none' then
      what = 'a ' .. kind
    end
  end
  if what then
    return refused(what)
  end
end

-- The learning record: `marked`, the override it holds (nil: none); `record` is nil when the
-- key holds another type (never written, never a mark).
local record, marked = false, nil
if rkey then
  local r = redis.pcall('GET', rkey)
  if type(r) == 'table' then
    record = nil
  elseif r then
    record = r
    local n, len, ends
    -- @controls r -> n, len, ends
    if len and len > 0 and n >= 1 then
      marked = sub(r, CONTROLS_HEAD, len)
    end
  end
end
local learned = marked ~= nil and marked == override
local learn_us, unmark = nil, false
if op == 97 then -- 'a': an operator's override stays as it is
  learn_us = #args >= pos + 8 and sunpack('<d', args, pos)
  if not (learn_us and learn_us >= 1 and learn_us < MAX_EXACT and learn_us % 1 == 0) then
    return invalid('the learned quota\'s time must be an integer of µs from 1 below 2^53')
  end
  pos = pos + 8
  -- An override of every route in the tenant's controls (as the decision script reads them).
  local all_routes = false
  if tkey then
    local t = redis.pcall('GET', tkey)
    if type(t) == 'table' then
      if t.err and sub(t.err, 1, 9) ~= 'WRONGTYPE' then
        return t
      end
    elseif t then
      local n, len, ends
      -- @controls t -> n, len, ends
      all_routes = len and len > 0 and n >= 1 or false
    end
  end
  if all_routes then
    -- An operator's choice for every route: nothing learned, and no learned override left to
    -- shadow it.
    op, learn_us, unmark = learned and 99 or 105, nil, true
  elseif not rkey or record == nil or override ~= '\0' and not learned then
    op, learn_us = 105, nil
  else
    op = 113
  end
elseif op == 117 then -- 'u'
  op, unmark = learned and 99 or 105, true
elseif op == 113 or op == 99 then
  unmark = true
end

if op == 105 then -- 'i'
elseif op == 113 then -- 'q'
  local n = byte(args, pos)
  if not n or n < 1 or n > MAX_TIERS or #args ~= pos + QUOTA_BYTES * n then
    return invalid('set quota takes 1 to 8 quotas')
  end
  for i = 0, n - 1 do
    local limit, period, burst = sunpack('<ddd', args, pos + 1 + QUOTA_BYTES * i)
    if not (limit >= 1 and limit < MAX_EXACT and limit % 1 == 0 and period >= 1 and
        period < MAX_EXACT and period % 1 == 0 and burst >= 1 and burst < MAX_EXACT and
        burst % 1 == 0) then
      return invalid('limit, period_us and burst must be integers from 1 below 2^53')
    end
  end
  override = sub(args, pos)
elseif op == 99 then -- 'c'
  override = '\0'
elseif op == 115 or op == 101 then -- 's', 'e'
  local duration = #args == pos + 7 and sunpack('<d', args, pos)
  if not (duration and duration >= 1 and duration < MAX_EXACT and duration % 1 == 0) then
    return invalid('the suspension must be an integer of µs from 1 below 2^53')
  end
  -- An extension only ever moves the end later (a late upstream Retry-After never cuts an
  -- operator's suspension); a stored end that is not a number is replaced.
  if op == 115 or not (until_us == until_us) or until_us < now + duration then
    until_us = now + duration
  end
elseif op == 114 then -- 'r'
  until_us = 0
elseif op == 120 then -- 'x'
  if tenant then
    -- Every route's states stored before this read as fresh. Always later than the last
    -- reset, so that one under a clock that is behind still resets.
    local last = reset_us
    -- Corrupt bytes (no time from 0 to MAX_EXACT, where last + 1 would equal last): none.
    if not (last >= 0 and last < MAX_EXACT) then
      last = 0
    end
    reset_us = now
    if not (reset_us > last) then
      reset_us = last + 1
    end
  else
    rest = ''
    if zkey then
      call('DEL', zkey)
    end
  end
else
  return invalid('unknown operation')
end

if op ~= 105 then
  local suspended = until_us > now
  local has_override = override ~= '\0'
  local new
  if tenant then
    new = ''
    if suspended or has_override or reset_us > 0 then
      new = 'M' .. spack('<d', suspended and until_us or 0) .. override
      if reset_us > 0 then
        new = new .. spack('<d', reset_us)
      end
    end
  else
    -- The controls go first; the tenant's reset the states belong to ('E') needs them.
    new = rest
    if suspended or has_override or byte(rest, 1) == STAMP then
      new = 'M' .. spack('<d', suspended and until_us or 0) .. override .. rest
    end
  end
  if new == '' then
    call('DEL', key)
  else
    -- Keep what was stored for as long as it was to live; the controls for as long as they
    -- last.
    local ttl = 1
    if pttl > 0 and (tenant or rest ~= '') then
      ttl = pttl
    end
    if has_override and (ttl < OVERRIDE_IDLE_MS) and (op == 113 or not tenant) then
      ttl = OVERRIDE_IDLE_MS
    end
    if reset_us > 0 and op == 120 and ttl < OVERRIDE_IDLE_MS then
      ttl = OVERRIDE_IDLE_MS
    end
    if suspended then
      local left = math.ceil((until_us - now) / 1000)
      if ttl < left then
        ttl = left
      end
    end
    -- At most 2^53 ms (a stored end however far ahead, +inf too, still gives a TTL), as an
    -- integer string (Redis may write a number with an exponent, which PX refuses: see
    -- lua/common.lua's write).
    if ttl > MAX_EXACT then
      ttl = MAX_EXACT
    end
    call('SET', key, new, 'PX', string.format('%d', ttl))
  end
  s = new ~= '' and new
end

if learn_us then
  -- Kept as long as the override is (at least), so that it is not taken for an operator's.
  local ttl = math.ceil(learn_us / 1000)
  if ttl < OVERRIDE_IDLE_MS then
    ttl = OVERRIDE_IDLE_MS
  end
  record = 'M' .. spack('<d', now + learn_us) .. override
  call('SET', rkey, record, 'PX', string.format('%d', ttl)) -- as above
elseif unmark and marked then
  -- Whatever follows the record's controls stays.
  local left = sub(record, CONTROLS_HEAD + #marked)
  if left == '' then
    call('DEL', rkey)
  else
    local ttl = call('PTTL', rkey)
    if ttl > 0 then
      call('SET', rkey, left, 'PX', string.format('%d', ttl))
    else
      call('SET', rkey, left)
    end
  end
  record = left ~= '' and left
end

local count = -1
if zkey then
  local n = redis.pcall('ZCARD', zkey)
  if type(n) == 'number' then
    count = n
  end
end
return { s, call('PTTL', key), string.format('%d', now), count, record or false }
