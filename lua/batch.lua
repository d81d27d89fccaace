-- redlimit: several decisions in one call, sent only when decisions queue behind a call in flight
-- (src/store/redis/batch.rs). The decision script (lua/common.lua with its steps) runs as the
-- function `decide`, spliced in at the `@decide` line, once per decision in order, each under
-- pcall: each is decided on its own and atomically (the whole call is), and one decision's error
-- (a NOPERM, a corrupt argument) is its own reply while the others still run. What a call costs
-- Redis besides its decisions (the command's dispatch, the script's lookup and start) is paid
-- once for all of them.
--
-- KEYS  every decision's keys in order, as one decision's (the route's string, the sliding log's
--       set, the tenant's string): 3 for the sliding log, 2 for the others.
-- ARGV  every decision's packed argument in order (lua/common.lua's ARGV[1]); its algorithm byte
--       (the 17th) says how many keys it takes.
-- Reply an array with one element per decision, in order: its decision's reply, or its error.

-- Names in capitals (MAX_EXACT, CONTROLS, STATE_LEN, ...) are the numbers every script shares:
-- Rust writes each one's value in as a literal when it assembles the script (`CONSTANTS` in
-- src/store/wire/scripts.rs), so they have one source and no call pays for a local.
local byte, find, error_reply = string.byte, string.find, redis.error_reply
-- What the decision script looks up first, once for the call.
local spack, sunpack, call, rpcall = struct.pack, struct.unpack, redis.call, redis.pcall
local KEYS, ARGV = KEYS, ARGV

local n = #ARGV
-- The keys first, so that a malformed call decides nothing; and each decision's tenant key (the
-- last of its keys).
local tenant_keys, k = {}, 0
for i = 1, n do
  if byte(ARGV[i], 17) == LOG_TAG then
    k = k + 3
  else
    k = k + 2
  end
  tenant_keys[i] = KEYS[k]
end
if n == 0 or k ~= #KEYS then
  return error_reply('ERR redlimit: invalid batch; expected each decision\'s keys (3 for ' ..
    'the sliding log, else 2) in order, then each decision\'s packed argument')
end

-- What every decision reads besides its own state, read once for the call: Redis's clock (the
-- decisions of one call are decided at one time), and the tenants' strings with one MGET (a
-- key of another type reads as absent, as with the decision script's GET). Decisions never
-- write a tenant's string, so each reads what it would have read itself. One TIME and one MGET
-- cost Redis less than a TIME and a GET per decision.
local time = redis.call('TIME')
local clock = time[1] * 1000000 + time[2]
local tenants = redis.call('MGET', unpack(tenant_keys))

-- `decide` is the decision script with its keys, argument and tenant's string as parameters
-- instead of KEYS, ARGV and its own reads: Rust replaces the lines that read them when it
-- assembles this script (`BATCH_SOURCE` in src/store/wire/scripts.rs). `key3` is the sliding log's
-- third key (false for the others).
local function decide(skey, lkey, key3, args, tenant)
-- @decide
end

-- Redis under `maxmemory` with nothing to evict refuses a script's first command that may add
-- memory (`OOM ...`) and lets every later one through: it decides once, when the call starts.
-- Alone, each decision's first write is such a command (lua/common.lua), so Redis refuses each
-- decision that would write. Here only the call's first would be refused: so the first
-- decision refused with OOM makes this call refuse, from then on, the commands of the
-- decisions that may add memory (SET, ZADD) with that error, as Redis would refuse each alone;
-- a decision that writes nothing (a denial) is decided as alone. (`call` and `rpcall` are the
-- decisions' upvalues: replacing them here is what they call next.)
local oom = false

local replies, k = {}, 1
for i = 1, n do
  local ok, reply
  local tenant_key = tenant_keys[i]
  -- Two keys end with the tenant's (a Lua string comparison is a pointer comparison).
  if KEYS[k + 1] == tenant_key then
    ok, reply = pcall(decide, KEYS[k], tenant_key, false, ARGV[i], tenants[i])
    k = k + 2
  else
    ok, reply = pcall(decide, KEYS[k], KEYS[k + 1], tenant_key, ARGV[i], tenants[i])
    k = k + 3
  end
  if not ok then
    -- A command's error is a table on Redis 7 and its message on older servers; a runtime
    -- error is a message without a code.
    if type(reply) == 'table' and reply.err then
      reply = error_reply(reply.err)
    else
      reply = tostring(reply)
      if not find(reply, '^%u+ ') then
        reply = 'ERR ' .. reply
      end
      reply = error_reply(reply)
    end
  end
  -- (A decision's own error reply, e.g. the sliding log's refused probe, is a table too.)
  if not oom and type(reply) == 'table' and reply.err and find(reply.err, '^OOM ') then
    oom = reply.err
    call = function(command, ...)
      if command == 'SET' or command == 'ZADD' then
        error({err = oom})
      end
      return redis.call(command, ...)
    end
    rpcall = function(command, ...)
      if command == 'SET' or command == 'ZADD' then
        return {err = oom}
      end
      return redis.pcall(command, ...)
    end
  end
  replies[i] = reply
end
return replies
