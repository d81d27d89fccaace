-- redlimit: fleet-wide concurrency slots. One sorted set per key holds the slots in use: each
-- member a slot's id, scored with the µs time its lease ends. A slot whose lease has ended is
-- free again (its holder died, or stopped renewing), so a dead instance's slots come back by
-- themselves within one lease.
--
-- KEYS  [1] the key's slots (`<prefix>:{<id>}:<scope>#c`).
-- ARGV  [1] packed little-endian '<dBdd': double now_us (-1 = Redis TIME), a byte naming the
--       operation ('a' acquire, 'n' renew, 'r' release), doubles limit (the slots, from 1
--       below 2^53) and lease_us (from 1 below 2^53); [2..] the slots' ids (1 to 64 bytes
--       each): exactly one to acquire, one or more to renew or release.
-- Reply {ok, n, wait_ms}: acquire: 1 and the slots left, or 0, 0 and the ms until the oldest
--       lease ends (the longest a slot can stay taken); renew: every slot's lease now ends a
--       lease from now, and a slot the set had lost (a FLUSHALL, a failover, a lease that ran
--       out while Redis was unreachable) is put back under its id, counted again even if the
--       key is now over its limit: ok 1 if none was lost, n the slots put back; release: n the
--       slots that were held, ok 1 if any.
-- The set expires one lease after its newest lease began: idle keys evaporate.

-- Names in capitals (MAX_EXACT, CONTROLS, STATE_LEN, ...) are the numbers every script shares:
-- Rust writes each one's value in as a literal when it assembles the script (`CONSTANTS` in
-- src/store/wire/scripts.rs), so they have one source and no call pays for a local.
local args = ARGV[1] or ''
if #ARGV < 2 or not KEYS[1] or #args ~= 25 then
  return redis.error_reply('ERR redlimit: invalid slot arguments; expected one key, one ' ..
    'argument packing now_us, operation, limit and lease_us, then the slot ids')
end
local now, op, limit, lease = struct.unpack('<dBdd', args)
if not ((now == -1 or now >= 0 and now < MAX_EXACT and now % 1 == 0) and limit >= 1 and
    limit < MAX_EXACT and limit % 1 == 0 and lease >= 1 and lease < MAX_EXACT and
    lease % 1 == 0) then
  return redis.error_reply('ERR redlimit: invalid slot arguments; now_us, limit and ' ..
    'lease_us must be integers below 2^53 (limit and lease_us at least 1)')
end
for i = 2, #ARGV do
  if #ARGV[i] < 1 or #ARGV[i] > 64 then
    return redis.error_reply('ERR redlimit: invalid slot arguments; a slot id has 1 to 64 bytes')
  end
end
if op == 97 and #ARGV ~= 2 then
  return redis.error_reply('ERR redlimit: invalid slot arguments; acquire takes one slot id')
end
if now == -1 then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end
local key = KEYS[1]
local ttl = math.ceil(lease / 1000)
local kind = redis.call('TYPE', key).ok
if kind ~= 'zset' then
  if op == 114 then
    return { 0, 0, 0 }
  end
  if kind ~= 'none' then
    redis.call('DEL', key) -- another type: a fresh key
  end
end
-- Leases that have ended are free.
redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', now))
local ends = string.format('%d', now + lease)

if op == 97 then -- 'a'
  local held = redis.call('ZCARD', key)
  if held >= limit then
    local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
    return { 0, 0, math.ceil((tonumber(oldest[2]) - now) / 1000) }
  end
  redis.call('ZADD', key, ends, ARGV[2])
  redis.call('PEXPIRE', key, ttl)
  return { 1, limit - held - 1, 0 }
elseif op == 110 then -- 'n'
  local restored = 0
  for i = 2, #ARGV do
    restored = restored + redis.call('ZADD', key, ends, ARGV[i])
  end
  redis.call('PEXPIRE', key, ttl)
  return { restored == 0 and 1 or 0, restored, 0 }
elseif op == 114 then -- 'r'
  local removed = redis.call('ZREM', key, unpack(ARGV, 2))
  return { removed > 0 and 1 or 0, removed, 0 }
end
return redis.error_reply('ERR redlimit: invalid slot arguments; unknown operation')
