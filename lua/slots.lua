-- redlimit: fleet-wide concurrency slots. One sorted set per key holds the slots in use: each
-- member a slot's id, scored with the µs time its lease ends. A slot whose lease has ended is
-- free again (its holder died, or stopped renewing), so a dead instance's slots come back by
-- themselves within one lease.
--
-- KEYS  [1] the key's slots (`<prefix>:{<id>}:<scope>#c`).
-- ARGV  one string, packed little-endian '<dBdd' then the slot's id: double now_us (-1 = Redis
--       TIME), a byte naming the operation ('a' acquire, 'n' renew, 'r' release), doubles
--       limit (the slots, from 1 below 2^53) and lease_us (from 1 below 2^53), then the id
--       (1 to 64 bytes).
-- Reply {ok, remaining, wait_ms}: acquire: 1 and the slots left, or 0 and the ms until the
--       oldest lease ends (the longest a slot can stay taken); renew: 1 if the slot was still
--       held (its lease now ends a lease from now), else 0; release: 1 if it was held.
-- The set expires one lease after its newest lease began: idle keys evaporate.

local MAX_EXACT = 9007199254740992
local args = ARGV[1] or ''
if #ARGV ~= 1 or not KEYS[1] or #args < 26 or #args > 89 then
  return redis.error_reply('ERR redlimit: invalid slot arguments; expected one key and one ' ..
    'argument packing now_us, operation, limit, lease_us and the slot id')
end
local now, op, limit, lease = struct.unpack('<dBdd', args)
if not ((now == -1 or now >= 0 and now < MAX_EXACT and now % 1 == 0) and limit >= 1 and
    limit < MAX_EXACT and limit % 1 == 0 and lease >= 1 and lease < MAX_EXACT and
    lease % 1 == 0) then
  return redis.error_reply('ERR redlimit: invalid slot arguments; now_us, limit and ' ..
    'lease_us must be integers below 2^53 (limit and lease_us at least 1)')
end
local id = string.sub(args, 26)
if now == -1 then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end
local key = KEYS[1]
local ttl = math.ceil(lease / 1000)
if redis.call('TYPE', key).ok ~= 'zset' then
  if op ~= 97 then
    return { 0, 0, 0 }
  end
  redis.call('DEL', key) -- another type: a fresh key
end
-- Leases that have ended are free.
redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', now))

if op == 97 then -- 'a'
  local held = redis.call('ZCARD', key)
  if held >= limit then
    local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
    return { 0, 0, math.ceil((tonumber(oldest[2]) - now) / 1000) }
  end
  redis.call('ZADD', key, string.format('%d', now + lease), id)
  redis.call('PEXPIRE', key, ttl)
  return { 1, limit - held - 1, 0 }
elseif op == 110 then -- 'n'
  local renewed = redis.call('ZADD', key, 'XX', 'CH', string.format('%d', now + lease), id)
  if renewed == 1 then
    redis.call('PEXPIRE', key, ttl)
  end
  return { renewed, 0, 0 }
elseif op == 114 then -- 'r'
  return { redis.call('ZREM', key, id), 0, 0 }
end
return redis.error_reply('ERR redlimit: invalid slot arguments; unknown operation')
