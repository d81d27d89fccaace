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
-- src/mirror/scripts.rs), so they have one source and no call pays for a local.
local byte, find, error_reply = string.byte, string.find, redis.error_reply

local n = #ARGV
-- The keys first, so that a malformed call decides nothing.
local keys = 0
for i = 1, n do
  if byte(ARGV[i], 17) == LOG_TAG then
    keys = keys + 3
  else
    keys = keys + 2
  end
end
if n == 0 or keys ~= #KEYS then
  return error_reply('ERR redlimit: invalid batch; expected each decision\'s keys (3 for ' ..
    'the sliding log, else 2) in order, then each decision\'s packed argument')
end

-- Redis's clock, read once: the decisions of one call are decided at one time (each reads it
-- here instead of calling TIME: the decision script's `TIME` lines are replaced with `now =
-- clock`). One TIME per call costs less than one per decision.
local t = redis.call('TIME')
local clock = t[1] * 1000000 + t[2]

local function decide(KEYS, ARGV)
-- @decide
end

local replies, k = {}, 1
for i = 1, n do
  local args = ARGV[i]
  local ok, reply
  if byte(args, 17) == LOG_TAG then
    ok, reply = pcall(decide, { KEYS[k], KEYS[k + 1], KEYS[k + 2] }, { args })
    k = k + 3
  else
    ok, reply = pcall(decide, { KEYS[k], KEYS[k + 1] }, { args })
    k = k + 2
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
  replies[i] = reply
end
return replies
