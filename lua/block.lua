-- redlimit: a decision that blocks on abuse. The decision script (lua/common.lua with its steps)
-- runs as the function `decide`, spliced in at the `@decide` line; when it denies by a quota
-- (not allowed, not suspended), the key's tenant is suspended for the block, in this same
-- call, as lua/control.lua's extend ('e') on the tenant's key does: the end only ever moves
-- later, the override and the reset stay.
--
-- KEYS  as a decision's (the route's string, the sliding log's set, the tenant's string),
--       then the tenant's offence count (`<prefix>:{<id>}#b`; read and written only when the
--       block doubles).
-- ARGV  [1] as a decision's; [2] packed '<dd': block_us (the first offence's), max_us (the
--       longest; equal: no doubling). Integers from 1 below 2^53.
-- Reply as a decision's (with now_us -2, an admission's time too); a denial that blocks says
--       retry_after_ms = the longer of the block's time left and the decision's own wait.
-- The offence count n (absent: 0) makes the block min(block_us * 2^n, max_us); it is written
-- back as n + 1 with a TTL of the block plus max_us, so offences are forgotten once the cap has
-- passed with no new block. The split form of a Cluster slot migration is not taken here: a
-- refusal (TRYAGAIN) goes to the caller like any error.

-- Names in capitals (MAX_EXACT, CONTROLS, STATE_LEN, ...) are the numbers every script shares:
-- Rust writes each one's value in as a literal when it assembles the script (`CONSTANTS` in
-- src/store/wire/scripts.rs), so they have one source and no call pays for a local.
local sunpack, spack = struct.unpack, struct.pack

local block = ARGV[2]
if #ARGV ~= 2 or #block ~= 16 then
  return redis.error_reply('ERR redlimit: invalid block arguments; expected the decision ' ..
    'argument, then block_us and max_us packed')
end
local block_us, max_us = sunpack('<dd', block)
if not (block_us >= 1 and block_us < MAX_EXACT and block_us % 1 == 0 and max_us >= block_us and
    max_us < MAX_EXACT and max_us % 1 == 0) then
  return redis.error_reply('ERR redlimit: invalid block arguments; block_us and max_us must ' ..
    'be integers from 1 below 2^53, max_us at least block_us')
end
local okey = KEYS[#KEYS]
local tkey = KEYS[#KEYS - 1]

local function decide(ARGV)
-- @decide
end

local reply = decide({ ARGV[1] })
if type(reply) ~= 'string' then
  return reply -- an admission's integer, or an error
end
local flags = string.byte(reply, 1)
if flags % 4 ~= 0 then
  return reply -- allowed, or suspended already
end

-- The block. Its time: the decision's (the caller's now, or Redis TIME again).
local now = sunpack('<d', ARGV[1])
if now < 0 then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end
local d = block_us
local offences = 0
if max_us > block_us then
  offences = tonumber(redis.pcall('GET', okey)) or 0
  d = math.min(block_us * 2 ^ math.min(offences, 60), max_us)
end

-- The tenant's string, as lua/control.lua reads it.
local s = redis.pcall('GET', tkey)
if type(s) ~= 'string' then
  s = false
end
local until_us, override, rest = 0, '\0', ''
if s and #s ~= STATE_LEN and #s ~= WIDE_STATE_LEN then
  local n, len
  -- @controls s -> n, len, until_us
  if len and len > 0 then
    override, rest = string.sub(s, CONTROLS_HEAD, len), string.sub(s, len + 1)
  end
end
local pttl = redis.call('PTTL', tkey)
if not (until_us == until_us) or until_us < now + d then
  until_us = now + d
end
local new = 'M' .. spack('<d', until_us) .. override
if #rest >= 8 then
  local reset_us = sunpack('<d', rest)
  if reset_us > 0 then
    new = new .. spack('<d', reset_us)
  end
end
local ttl = 1
if pttl > 0 then
  ttl = pttl
end
local left = math.ceil((until_us - now) / 1000)
if ttl < left then
  ttl = left
end
-- TTLs as integers (see lua/common.lua's write).
redis.call('SET', tkey, new, 'PX', string.format('%d', ttl))
if max_us > block_us then
  redis.call('SET', okey, offences + 1, 'PX',
    string.format('%d', math.ceil((d + max_us) / 1000)))
end

-- The reply: the denial, told to come back when the block ends, or when the quota admits
-- again if that is later (never sooner than a request would be admitted).
local rest_of_reply = string.sub(reply, 27)
local _, pos, rem, retry, reset = sunpack('<BBddd', reply)
if retry > left then
  left = retry
end
if left > MAX_EXACT then
  left = MAX_EXACT
end
return spack('<BBddd', flags, pos, rem, left, reset) .. rest_of_reply
