-- wrk -s scripts/wrk-keys.lua URL [-- KEYS]
--
-- Each request carries one of KEYS `x-api-key` values (10 000 unless given), in turn, so that
-- a limiter keyed by that header counts them under KEYS keys. The requests are formatted once,
-- in init, so that a request costs wrk about what one with a fixed header does.

local threads = 0

-- Runs once per wrk thread, before its own copy of this script starts: number the threads.
function setup(thread)
  thread:set("id", threads)
  threads = threads + 1
end

local requests = {}
local last = 0

function init(args)
  local keys = tonumber(args[1]) or 10000
  for i = 1, keys do
    requests[i] = wrk.format(nil, nil, { ["x-api-key"] = "key-" .. i })
  end
  -- Threads start a prime stride apart, so that they do not send the same key together.
  last = (id * 7919) % keys
end

function request()
  last = last % #requests + 1
  return requests[last]
end
